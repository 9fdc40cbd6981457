#!/usr/bin/env bash
# Times a suite of unique bricks on a Slurm cluster: one array task per
# shard, each task alone on its node, each into its own store; then merge.
#
#   dlbricks export --models=... --suite=suite     # once, anywhere
#   sbatch deploy/slurm_array.sh                    # 4 shards of ./suite
#   sbatch --array=0-15 deploy/slurm_array.sh       # 16 shards
#   python -m tools.dlbricks merge --db=all.sqlite stores/shard_*.sqlite
#
# Submit from the repository root (or where `python -m tools.dlbricks`
# imports). The array range alone sets the shards: each task reads its
# shard from SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT
# (dlbricks_tf/running/sharding.py), so --array=0-15 means 16 shards. --exclusive
# keeps every other job off the node while a task times; on a one-node
# cluster add %1 (--array=0-3%1) to queue the tasks one after another.
#
# Environment (sbatch passes the submitter's):
#   DLBRICKS_ARGS    what to time and how, split on spaces (default:
#                    --suite=suite); e.g. "--models=a.keras --batch_size=8"
#   DLBRICKS_STORES  folder of the shard stores (default: stores)
#   DLBRICKS_PYTHON  Python with dlbricks_tf installed (default: python3)
#
# The store is written on the node's local disk and copied to
# $DLBRICKS_STORES/shard_<task id>.sqlite at the end, even after a failure
# (each brick is committed as it is timed): SQLite's locking is not safe
# on NFS. A stored shard is copied back first, so resubmitting the array
# times only what is missing.
#
#SBATCH --job-name=dlbricks-bench
#SBATCH --array=0-3
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --exclusive
#SBATCH --output=slurm-%A_%a.out
set -euo pipefail

cd "${SLURM_SUBMIT_DIR:-.}"
: "${SLURM_ARRAY_TASK_ID:?submit with sbatch (see deploy/slurm_array.sh)}"
stores="${DLBRICKS_STORES:-stores}"
final="$stores/shard_${SLURM_ARRAY_TASK_ID}.sqlite"
db="${TMPDIR:-/tmp}/dlbricks_${SLURM_JOB_ID:-$$}_${SLURM_ARRAY_TASK_ID}.sqlite"
mkdir -p "$stores"
trap 'rm -f "$db" "$db-wal" "$db-shm"' EXIT
if [[ -f $final ]]; then
  cp "$final" "$db"
fi
read -r -a args <<<"${DLBRICKS_ARGS:---suite=suite}"

echo "dlbricks: array task ${SLURM_ARRAY_TASK_ID} on $(hostname)," \
  "store $final"
python="${DLBRICKS_PYTHON:-python3}"
status=0
"$python" -m tools.dlbricks bench "${args[@]}" --db="$db" || status=$?
if [[ -s $db ]]; then
  # Moves what a killed run left in the write-ahead log into the file.
  "$python" -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute(
    "PRAGMA wal_checkpoint(TRUNCATE)")' "$db"
  cp "$db" "$final.part"
  mv "$final.part" "$final"
fi
exit "$status"
