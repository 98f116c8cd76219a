#!/bin/bash
# Alternate a grid config between two source trees (e.g. a worktree of the base commit and this one), so
# both see the same machine load: ab_trees.sh CONFIG BASE_TREE NEW_TREE ROUNDS OUT_DIR
# Each launch writes OUT_DIR/<config>_<base|new><round>.jsonl. Needs root (namespaces); hold the
# machine's CPU lock around it where others share the machine.
set -eu
cfg=$(realpath "$1"); base=$(realpath "$2"); new=$(realpath "$3"); rounds=$4; out=$(realpath -m "$5")
name=$(basename "$cfg" .json)
mkdir -p "$out"
for i in $(seq 1 "$rounds"); do
  for t in base new; do
    tree=$base; [ $t = new ] && tree=$new
    rm -f "$out/${name}_$t$i.jsonl"
    # from inside the tree: python -m puts the working directory ahead of PYTHONPATH
    (cd "$tree" && PYTHONPATH=$tree python -m pushpull bench grid "$cfg" --out "$out/${name}_$t$i.jsonl" --no-progress > /dev/null)
  done
done
