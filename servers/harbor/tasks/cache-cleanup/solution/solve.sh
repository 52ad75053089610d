#!/bin/bash
# Oracle: compare each regular file's mtime (nanoseconds) with the marker's, skip the pinned
# paths, delete with NUL-separated names, then remove empty folders bottom-up.
set -euo pipefail
cd /var/cache/thumbs
marker=$(stat -c %.9Y .last-sync | tr -d .)
declare -A pinned=()
while IFS= read -r line || [ -n "$line" ]; do
    case $line in ''|'#'*) continue ;; esac
    pinned[$line]=1
done < pinned.txt
while IFS= read -r -d '' f; do
    rel=${f#./}
    [ -n "${pinned[$rel]+x}" ] && continue
    mtime=$(stat -c %.9Y -- "$f" | tr -d .)
    if [ "$mtime" -lt "$marker" ]; then
        rm -f -- "$f"
    fi
done < <(find . -type f -print0)
find . -mindepth 1 -depth -type d -empty -delete
