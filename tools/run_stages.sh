#!/usr/bin/env bash
# Runs each make target named, whatever the earlier ones did, then prints one
# line per target (its exit status, wall time and closing line) and a total
# of the pytest counts; exits 1 if any target failed. `make test` uses it so
# that one red stage does not hide a second problem in a later one.
#
#   tools/run_stages.sh TARGET...      (MAKE names the make to run; default make)
#
# A TARGET of the form a+b(+...) runs make targets a, b, ... side by side (each
# one's output kept apart and printed whole when all have ended): two
# test stages that each leave a core idle now and then fill each other's
# idle time.
set -uo pipefail

make_cmd=${MAKE:-make}
failed=0
rows=()
declare -A totals=([passed]=0 [failed]=0 [skipped]=0)
workdir=$(mktemp -d)
trap 'rm -rf "$workdir"' EXIT

# record TARGET LOG RC SECONDS: one row for the target; counts into totals.
record() {
  local target=$1 log=$2 rc=$3 seconds=$4
  # pytest's closing lines ("N passed, M skipped in Ts"; one per pytest run
  # of the target), else mypy's ("Success: ..." / "Found N errors ..."), else
  # Sphinx's ("build succeeded." / "build finished with problems, ...").
  local closing
  closing=$(grep -E "^(=+ )?[0-9]+ (passed|failed|skipped|errors?)\b.* in [0-9.]+s|^Success: |^Found [0-9]+ errors?|^build (succeeded|finished with problems)" "$log")
  local stage_failures=0 count word
  while read -r count word; do
    case $word in
      passed|skipped) totals[$word]=$((totals[$word] + count)) ;;
      failed|error|errors) stage_failures=$((stage_failures + count)) ;;
    esac
  done < <(grep -oE "[0-9]+ (passed|failed|skipped|errors?)\b" <<<"$closing" || true)
  # A stage that failed without a count (mypy, a crash) counts once.
  if [ "$rc" -ne 0 ] && [ "$stage_failures" -eq 0 ]; then stage_failures=1; fi
  totals[failed]=$((totals[failed] + stage_failures))
  rows+=("$(printf '%-26s rc %-3d %5ds  %s' "$target" "$rc" "$seconds" "$(tr '\n' ';' <<<"$closing" | sed 's/;$//; s/;/; /g')")")
  [ "$rc" -eq 0 ] || failed=1
}

for group in "$@"; do
  IFS=+ read -ra targets <<<"$group"
  if [ "${#targets[@]}" -eq 1 ]; then
    log="$workdir/$group.log"
    start=$SECONDS
    "$make_cmd" --no-print-directory "$group" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    record "$group" "$log" "$rc" $((SECONDS - start))
    continue
  fi
  echo "Running side by side: ${targets[*]} (each one's output follows when all have ended)"
  declare -A pids=() started=()
  for target in "${targets[@]}"; do
    started[$target]=$SECONDS
    ( "$make_cmd" --no-print-directory "$target" > "$workdir/$target.log" 2>&1
      echo $? > "$workdir/$target.rc"; echo $SECONDS > "$workdir/$target.end" ) &
    pids[$target]=$!
  done
  for target in "${targets[@]}"; do
    wait "${pids[$target]}"
  done
  for target in "${targets[@]}"; do
    echo "===== $target ====="
    cat "$workdir/$target.log"
    record "$target" "$workdir/$target.log" "$(cat "$workdir/$target.rc")" \
      $(( $(cat "$workdir/$target.end") - started[$target] ))
  done
  unset pids started
done

echo
echo "Stages (target, exit status, wall time, closing lines):"
printf '  %s\n' "${rows[@]}"
if [ "$failed" -ne 0 ]; then
  echo "At least one stage failed: see its output above."
fi
# The plain closing line, over every stage.
echo "stages: ${totals[passed]} passed, ${totals[failed]} failed, ${totals[skipped]} skipped"
exit "$failed"
