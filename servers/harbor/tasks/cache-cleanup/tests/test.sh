#!/bin/bash
# Verifier of cache-cleanup: the cache must hold exactly the expected regular files (each with its
# own contents and its original modification time), the expected folders and the symbolic link.
# The expected state is written out here, from the tree the image was built with.
set -u
reward=0
trap 'echo "$reward" > /logs/verifier/reward.txt' EXIT
export TZ=UTC LC_ALL=C

root=/var/cache/thumbs
if ! cd "$root" 2>/dev/null; then
    echo "no $root"
    exit 0
fi
listing() {  # listing TYPE: the paths of that type, NUL-free and one per line, with newlines shown as \n
    find . -mindepth 1 -type "$1" -printf '%P\0' | sort -z | while IFS= read -r -d '' p; do
        printf '%s\n' "${p//$'\n'/\\n}"
    done
}
failures=0
same() {  # same WHAT GOT WANTED
    if [ "$2" != "$3" ]; then
        printf '%s differ:\n--- wanted\n%s\n--- got\n%s\n' "$1" "$3" "$2"
        failures=$((failures + 1))
    fi
}

kept=(".last-sync|2024-06-01 12:00:00" "2024/05/pinned old.png|2024-05-01 10:00:00"
      "2024/05/same-time.png|2024-06-01 12:00:00" "2024/06/new.png|2024-06-02 09:30:00"
      "albums/summer/cover.png|2024-07-01 00:00:00" "pinned.txt|2024-06-02 00:00:00")
wanted_files=$(for k in "${kept[@]}"; do printf '%s\n' "${k%%|*}"; done | sort)
same "regular files" "$(listing f)" "$wanted_files"
same "folders" "$(listing d)" $'2024\n2024/05\n2024/06\nalbums\nalbums/summer'
same "links" "$(listing l)" "latest"
same "link target" "$(readlink latest)" /var/cache/thumbs/2024/06/new.png

for k in "${kept[@]}"; do
    path=${k%%|*} when=${k#*|}
    [ -f "$path" ] || continue
    if [ "$path" != pinned.txt ]; then
        same "contents of $path" "$(cat -- "$path")" "$path"
    fi
    same "modification time of $path" "$(date -d "@$(stat -c %Y -- "$path")" '+%F %T')" "$when"
done
same "pinned.txt" "$(sed -n 3p pinned.txt)" "2024/05/pinned old.png"

if [ "$failures" == 0 ]; then
    reward=1
fi
