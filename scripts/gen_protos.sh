#!/usr/bin/env bash
# Regenerates the Python stubs of every proto/*.proto into services/rpc/ (or into $1).
# Generated code imports sibling modules absolutely (`import kvtier_pb2`); those imports are
# rewritten package-relative so that `services.rpc.<name>_pb2_grpc` imports work.
# Usage: scripts/gen_protos.sh [OUT_DIR]    (PYTHON=... selects the interpreter; needs grpcio-tools)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/services/rpc}"
python="${PYTHON:-python}"
mkdir -p "$out"
shopt -s nullglob
protos=("$root"/proto/*.proto)
if [ "${#protos[@]}" -eq 0 ]; then
    echo "gen_protos: no proto/*.proto found" >&2
    exit 1
fi
names=()
for p in "${protos[@]}"; do names+=("$(basename "$p")"); done
(cd "$root/proto" && "$python" -m grpc_tools.protoc -I. \
    --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" "${names[@]}")
for p in "${names[@]}"; do
    stem="${p%.proto}"
    for f in "$out/${stem}_pb2.py" "$out/${stem}_pb2.pyi" "$out/${stem}_pb2_grpc.py"; do
        [ -f "$f" ] || continue
        sed -i -E \
            -e 's/^import ([A-Za-z0-9_]+_pb2)( as .*)?$/from . import \1\2/' \
            -e 's/^from ([A-Za-z0-9_]+_pb2) import /from .\1 import /' \
            "$f"
    done
done
[ -f "$out/__init__.py" ] || : > "$out/__init__.py"
echo "gen_protos: ${names[*]} -> $out"
