#!/bin/bash
echo nan > /logs/verifier/reward.txt
