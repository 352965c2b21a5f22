#!/usr/bin/env bash
# Files larger than one device run can carry (64 MB with the working tree), in parts over two calls.
#   scripts/carry_parts.sh split FILE DIR1 DIR2    here: the first 40 MB of FILE into DIR1, the rest and its
#                                                  sha256 into DIR2 (carry DIR1 in one run, DIR2 in the next)
#   scripts/carry_parts.sh join PARTS_DIR DEST     on the device: every NAME.part1 + NAME.part2 found in
#                                                  PARTS_DIR or .carry/* joined into DEST/NAME, sha256 checked
set -euo pipefail
case ${1:-} in
  split)
    file=${2:?FILE}; a=${3:?DIR1}; b=${4:?DIR2}; name=$(basename "$file")
    mkdir -p "$a" "$b"
    head -c 41943040 "$file" >"$a/$name.part1"
    tail -c +41943041 "$file" >"$b/$name.part2"
    sha256sum "$file" | awk '{print $1}' >"$b/$name.sha256"
    du -sh "$a" "$b" ;;
  join)
    parts=${2:?PARTS_DIR}; dest=${3:?DEST}; mkdir -p "$dest"
    found=0
    for first in "$parts"/*.part1 .carry/*/*.part1; do
      [ -f "$first" ] || continue
      name=$(basename "$first" .part1)
      second=$(ls "$parts/$name.part2" .carry/*/"$name.part2" 2>/dev/null | head -1 || true)
      sum=$(cat "$parts/$name.sha256" .carry/*/"$name.sha256" 2>/dev/null | head -1 || true)
      [ -n "$second" ] && [ -n "$sum" ] || { echo "missing part 2 or sha256 of $name"; exit 1; }
      cat "$first" "$second" >"$dest/$name"
      echo "$sum  $dest/$name" | sha256sum -c - || exit 1
      found=1
    done
    [ $found = 1 ] || { echo "no parts found in $parts or .carry/"; exit 1; } ;;
  *) echo "usage: $0 split FILE DIR1 DIR2 | join PARTS_DIR DEST"; exit 2 ;;
esac
