#!/bin/bash
# Verifier of log-error-summary: the report must list exactly the expected "<count> <code>" lines
# in the expected order. Spacing, CR line ends and a missing final newline are forgiven; the
# expected report travels with the tests (the counts were taken from the logs the image ships).
set -u
reward=0
trap 'echo "$reward" > /logs/verifier/reward.txt' EXIT

report=/root/error_report.txt
if [ ! -f "$report" ]; then
    echo "no $report"
    exit 0
fi
# A plain file at that very path: a link (or a folder on the way that is one) could lead to
# what these tests bring, such as the expected report itself.
if [ "$(realpath -e -- "$report" 2>/dev/null)" != "$report" ]; then
    echo "$report is a link, or reached through one"
    exit 0
fi
normalised=$(tr -d '\r' < "$report" | awk 'NF { $1 = $1; print }')
expected=$(cat /tests/expected_report.txt)
if [ "$normalised" == "$expected" ]; then
    reward=1
else
    echo "report differs from the expected one:"
    diff <(printf '%s\n' "$expected") <(printf '%s\n' "$normalised") | head -20
fi
