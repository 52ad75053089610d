#!/bin/bash
# Oracle: match each inbox name against the four patterns with bash regexes, build the target
# path from the captured fields, and mv (names may hold spaces or start with "-").
set -euo pipefail
shopt -s nullglob nocasematch
cd /data/inbox
for f in * .[!.]*; do
    [ -f "$f" ] || continue
    if [[ $f =~ IMG_([0-9]{4})([0-9]{2})([0-9]{2})_([0-9]{6})\.(jpe?g|png)$ ]] \
       || [[ $f =~ PXL_([0-9]{4})([0-9]{2})([0-9]{2})_([0-9]{6})[0-9]{3}\.(jpe?g|png)$ ]]; then
        y=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} d=${BASH_REMATCH[3]} t=${BASH_REMATCH[4]} e=${BASH_REMATCH[5]}
    elif [[ $f =~ Screenshot\ ([0-9]{4})-([0-9]{2})-([0-9]{2})\ at\ ([0-9]{2})\.([0-9]{2})\.([0-9]{2})\.(jpe?g|png)$ ]] \
         || [[ $f =~ photo\ ([0-9]{4})-([0-9]{2})-([0-9]{2})\ ([0-9]{2})-([0-9]{2})-([0-9]{2})\.(jpe?g|png)$ ]]; then
        y=${BASH_REMATCH[1]} m=${BASH_REMATCH[2]} d=${BASH_REMATCH[3]}
        t=${BASH_REMATCH[4]}${BASH_REMATCH[5]}${BASH_REMATCH[6]} e=${BASH_REMATCH[7]}
    else
        continue
    fi
    e=${e,,}
    [ "$e" == jpeg ] && e=jpg
    mkdir -p "/data/library/$y/$m"
    mv -n -- "$f" "/data/library/$y/$m/$y-$m-${d}_$t.$e"
done
