#!/bin/bash
# Oracle: three cron lines (minute */20 over hours 8-18 covers 08:00..18:40), the two variables,
# root-owned mode 644.
set -euo pipefail
cat > /etc/cron.d/reports <<'CRON'
MAILTO=""
SHELL=/bin/bash
# m   h     dom mon        dow  user     command
30    7     *   *          1-5  reports  /usr/local/bin/send-report
*/20  8-18  *   *          *    root     /usr/local/bin/prune-tmp
15    3     1   1,4,7,10   *    billing  /usr/local/bin/monthly-invoice
CRON
chown root:root /etc/cron.d/reports
chmod 644 /etc/cron.d/reports
