#!/bin/bash
# Verifier of fix-snapshot-script: runs the agent's /usr/local/bin/snapshot.sh on fresh folders
# made here, as uid/gid 65534 (nobody, named by number: the agent may have renamed accounts; so
# it can neither read these tests nor touch the reward), and scores four behaviours of the instruction as named parts in reward.json:
#   naming          printed path == DEST/<name>-<YYYYMMDD>.tar.gz, exit 0, archive there, right members
#   excludes        *.tmp files and .cache folders (any depth) left out, hidden files kept
#   spaces          spaces in SRC, DEST and file names
#   missing_source  non-zero exit and nothing created when SRC does not exist
# reward is the mean of the parts.
set -u
naming=0 excludes=0 spaces=0 missing_source=0
write_reward() {
    local mean
    mean=$(awk -v a="$naming" -v b="$excludes" -v c="$spaces" -v d="$missing_source" \
        'BEGIN { printf "%.4f", (a + b + c + d) / 4 }')
    printf '{"reward": %s, "naming": %d, "excludes": %d, "spaces": %d, "missing_source": %d}\n' \
        "$mean" "$naming" "$excludes" "$spaces" "$missing_source" > /logs/verifier/reward.json
}
trap write_reward EXIT

chmod 700 /tests
work=$(mktemp -d /tmp/verify.XXXXXX)
chmod 755 "$work"
script=/usr/local/bin/snapshot.sh

as_nobody() {  # as_nobody DIR CMD...: run CMD in DIR as uid/gid 65534, 10 s at most
    local dir=$1
    shift
    (cd "$dir" && timeout 10 setpriv --reuid=65534 --regid=65534 --clear-groups "$@")
}
members() {  # the regular members of a .tar.gz, relative, sorted
    tar -tzf "$1" 2>/dev/null | sed -e 's#^\./##' | grep -v -e '/$' -e '^\.\?$' | LC_ALL=C sort
}
only_file_in() {  # the one file in a folder, or nothing
    local found
    found=$(find "$1" -mindepth 1 -maxdepth 1 -type f)
    if [ -n "$found" ] && [ "$(printf '%s\n' "$found" | wc -l)" == 1 ]; then
        printf '%s' "$found"
    fi
}
make_tree() {  # make_tree ROOT FILE...: files with their own path as content, owned by 65534
    local root=$1 f
    shift
    for f in "$@"; do
        mkdir -p "$root/$(dirname -- "$f")"
        printf '%s\n' "$f" > "$root/$f"
    done
    chown -R 65534:65534 "$root"
}

if [ ! -x "$script" ]; then
    echo "$script is missing or not executable"
    exit 0
fi

# naming
make_tree "$work/n/proj" a.txt sub/b.txt
mkdir "$work/n/out" && chown 65534:65534 "$work/n/out"
before=$(date +%Y%m%d)
printed=$(as_nobody / "$script" "$work/n/proj" "$work/n/out")
status=$?
after=$(date +%Y%m%d)
printed=$(printf '%s' "$printed" | tr -d '\r' | sed -e 's/[[:space:]]*$//')
if [ "$status" == 0 ] \
   && { [ "$printed" == "$work/n/out/proj-$before.tar.gz" ] || [ "$printed" == "$work/n/out/proj-$after.tar.gz" ]; } \
   && [ -f "$printed" ] && [ "$(members "$printed" | tr '\n' ' ')" == "a.txt sub/b.txt " ]; then
    naming=1
else
    echo "naming: exit $status, printed '$printed', expected $work/n/out/proj-$after.tar.gz"
fi

# excludes
make_tree "$work/e/proj" keep.txt .hidden drop.tmp .cache/x deep/.cache/y deep/keep.tmp.txt deep/z.md deep/old.tmp
mkdir "$work/e/out" && chown 65534:65534 "$work/e/out"
as_nobody "$work/e" "$script" "$work/e/proj" "$work/e/out" > /dev/null
archive=$(only_file_in "$work/e/out")
got=$(if [ -n "$archive" ]; then members "$archive" | tr '\n' ' '; fi)
if [ "$got" == ".hidden deep/keep.tmp.txt deep/z.md keep.txt " ]; then
    excludes=1
else
    echo "excludes: archive members: '$got'"
fi

# spaces
make_tree "$work/s/with space/my project" "a b.txt" "sub dir/c  d.txt" "-dash.txt"
mkdir -p "$work/s/out dir" && chown 65534:65534 "$work/s/out dir"
as_nobody "$work/s" "$script" "$work/s/with space/my project" "$work/s/out dir" > /dev/null
archive=$(only_file_in "$work/s/out dir")
got=$(if [ -n "$archive" ]; then members "$archive" | tr '\n' '|'; fi)
if [ "$got" == "-dash.txt|a b.txt|sub dir/c  d.txt|" ] && [ "$(basename "$archive")" == "my project-$(date +%Y%m%d).tar.gz" ]; then
    spaces=1
else
    echo "spaces: archive '$archive' members: '$got'"
fi

# missing_source
mkdir -p "$work/m/out" "$work/m/cwd"
printf 'x\n' > "$work/m/cwd/stray.txt"
chown -R 65534:65534 "$work/m"
as_nobody "$work/m/cwd" "$script" "$work/m/nope" "$work/m/out" > /dev/null 2>&1
status=$?
if [ "$status" != 0 ] && [ -z "$(ls -A "$work/m/out")" ] && [ "$(ls -A "$work/m/cwd")" == stray.txt ]; then
    missing_source=1
else
    echo "missing_source: exit $status, out holds '$(ls -A "$work/m/out")'"
fi
