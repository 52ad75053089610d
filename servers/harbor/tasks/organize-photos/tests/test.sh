#!/bin/bash
# Verifier of organize-photos: the library holds exactly the expected files, each with the content
# (sha256) of the photo it came from, and the inbox holds exactly the files that are not photos.
# Both lists travel with the tests.
set -u
reward=0
trap 'echo "$reward" > /logs/verifier/reward.txt' EXIT

ok=1
if ! library=$(cd /data/library 2>/dev/null && find . -type f -printf '%P\n' | LC_ALL=C sort); then
    echo "no /data/library"
    exit 0
fi
expected_library=$(awk '{ print $2 }' /tests/expected_library.txt | LC_ALL=C sort)
if [ "$library" != "$expected_library" ]; then
    echo "library files differ (< expected, > found):"
    diff <(printf '%s\n' "$expected_library") <(printf '%s\n' "$library") | head -20
    ok=0
elif ! (cd /data/library && sha256sum --quiet --check /tests/expected_library.txt); then
    echo "some library file does not hold the photo it should"
    ok=0
fi
inbox=$(cd /data/inbox 2>/dev/null && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort)
if [ "$inbox" != "$(LC_ALL=C sort /tests/expected_inbox.txt)" ]; then
    echo "inbox should hold only: $(tr '\n' ' ' < /tests/expected_inbox.txt); it holds:"
    printf '%s\n' "$inbox" | head -20
    ok=0
fi
if [ "$ok" == 1 ]; then
    reward=1
fi
