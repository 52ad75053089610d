#!/bin/bash
# Oracle: read every file (compressed or not), keep the level field ERROR, pull out code=E..., count.
set -euo pipefail
cd /var/log/shop
{ cat app.log app.log.1; zcat app.log.2.gz app.log.3.gz; } \
  | tr -d '\r' \
  | awk '$2 == "ERROR" { if (match($0, /code=E[0-9]+/)) print substr($0, RSTART + 5, RLENGTH - 5) }' \
  | sort | uniq -c \
  | awk '{ print $1, $2 }' \
  | sort -k1,1nr -k2,2 > /root/error_report.txt
