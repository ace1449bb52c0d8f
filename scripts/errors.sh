#!/usr/bin/env bash
# last_error_line LOG: the last line of LOG that reads as an error (a logger's "ERROR ...",
# a Python exception, pip's "ERROR: ..."), else LOG's last line: what a failed step of
# scripts/setup.sh, scripts/quickstart.sh or scripts/upgrade-check.sh names on the console.
last_error_line() {
  local line
  line="$(grep -E '(^|[] :])ERROR[]: ]|^([A-Za-z_][A-Za-z0-9_.]*)?(Error|Exception)(: |$)|^error: |No matching distribution|THESE PACKAGES DO NOT MATCH' "$1" 2>/dev/null | tail -n 1)"
  echo "${line:-$(tail -n 1 "$1" 2>/dev/null)}"
}
