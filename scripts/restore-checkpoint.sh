#!/usr/bin/env bash
# Restore a research checkpoint that left the working tree (issue 48: the tree must travel to a GPU machine in
# 64 MiB) from git history into artifacts/checkpoints/NAME, where `crossprobe eval --baseline` and the research
# scripts look for it.
#   scripts/restore-checkpoint.sh pre-bridge     the model before the label bridge (eval's out-of-domain baseline)
#   scripts/restore-checkpoint.sh order-loss     the ablation's winning tower option, with its own rerankers
# The files are read from commit 6bcb7237d75e3f1e2e8ac6b66f47cfacb131e168, the last one that held them (docs/research cite it).
set -euo pipefail
COMMIT=6bcb7237d75e3f1e2e8ac6b66f47cfacb131e168
name=${1:?usage: scripts/restore-checkpoint.sh pre-bridge|order-loss}
case "$name" in pre-bridge|order-loss) ;; *) echo "unknown checkpoint $name (pre-bridge, order-loss)" >&2; exit 2;; esac
cd "$(dirname "$0")/.."
out=artifacts/checkpoints/$name
tmp=$(mktemp -d artifacts/.restore-XXXXXX 2>/dev/null || { mkdir -p artifacts; mktemp -d artifacts/.restore-XXXXXX; })
trap 'rm -rf "$tmp"' EXIT
for f in $(git ls-tree --name-only "$COMMIT" "models/checkpoints/$name/"); do
  git show "$COMMIT:$f" > "$tmp/$(basename "$f")"
done
mkdir -p artifacts/checkpoints
rm -rf "$out" && mv "$tmp" "$out" && trap - EXIT
echo "restored $name from $COMMIT into $out"
