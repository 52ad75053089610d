#!/bin/bash
# Reward 1 when /app/greeting.txt holds exactly "hello".
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "hello" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
