#!/bin/bash
# Builds /var/cache/thumbs with fixed modification times (run once at image build, then removed).
set -euo pipefail
root=/var/cache/thumbs
mkdir -p "$root"
put() {  # put MTIME PATH: a file holding its own path, modified at MTIME
    mkdir -p "$(dirname -- "$root/$2")"
    printf '%s\n' "$2" > "$root/$2"
    touch -d "$1" -- "$root/$2"
}
put "2024-06-01 12:00:00" .last-sync
put "2023-05-01 08:00:00" 2023/a.png
put "2023-05-02 08:00:00" 2023/b.png
put "2024-05-31 23:59:59" "2024/05/old one.png"
put "2024-05-01 10:00:00" "2024/05/pinned old.png"
put "2024-06-01 12:00:00" 2024/05/same-time.png
put "2024-06-02 09:30:00" 2024/06/new.png
put "2024-01-01 00:00:00" 2024/06/-dash.png
put "2024-01-01 00:00:00" "2024/06/weird"$'\n'"name.png"
put "2024-07-01 00:00:00" albums/summer/cover.png
put "2022-01-01 00:00:00" albums/summer/.hidden-old.png
put "2022-01-01 00:00:00" albums/winter/x.png
put "2022-02-01 00:00:00" albums/winter/y.png
put "2020-03-03 03:03:03" tmp/deep/er/z.png
mkdir -p "$root/empty-dir"
ln -s /var/cache/thumbs/2024/06/new.png "$root/latest"
touch -h -d "2020-01-01 00:00:00" "$root/latest"
printf '# thumbnails that must survive every cleanup\n\n2024/05/pinned old.png\nalbums/summer/gone.png\n' > "$root/pinned.txt"
touch -d "2024-06-02 00:00:00" "$root/pinned.txt"
