#!/bin/bash
# Oracle: rewrite the script with every expansion quoted, the date as %Y%m%d, an early exit when
# SRC is missing, and tar's own --exclude options instead of a word-split file list.
set -euo pipefail
cat > /usr/local/bin/snapshot.sh <<'SCRIPT'
#!/bin/bash
# snapshot.sh SRC DEST
# Archives the folder SRC into DEST/<name of SRC>-<YYYYMMDD>.tar.gz (today's date), leaving out
# *.tmp files and .cache folders, prints the archive's path, and fails when SRC is not a folder.
set -u
if [ "$#" -ne 2 ]; then
    echo "usage: snapshot.sh SRC DEST" >&2
    exit 2
fi
src=$1
dest=$2
if [ ! -d "$src" ]; then
    echo "snapshot: no such folder: $src" >&2
    exit 1
fi
name=$(basename -- "$src")
archive="$dest/$name-$(date +%Y%m%d).tar.gz"
tar -czf "$archive" -C "$src" --exclude='*.tmp' --exclude='.cache' . || exit 1
echo "$archive"
SCRIPT
chmod 755 /usr/local/bin/snapshot.sh
