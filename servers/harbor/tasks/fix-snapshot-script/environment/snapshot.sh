#!/bin/bash
# snapshot.sh SRC DEST
# Archives the folder SRC into DEST/<name of SRC>-<YYYYMMDD>.tar.gz (today's date), leaving out
# *.tmp files and .cache folders, prints the archive's path, and fails when SRC is not a folder.
src=$1
dest=$2
name=$(basename $src)
archive=$dest/$name-$(date +%Y-%m-%d).tar.gz

if [ ! -d $src ]; then
    echo "snapshot: no such folder: $src" >&2
fi

cd $src
files=$(find . -type f ! -name '*.tmp')
tar -czf $archive $files
echo $archive
