#!/bin/bash
echo "all checks ran, but no reward is written"
