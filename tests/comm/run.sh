#!/bin/sh
# tests/comm/run.sh: runs test_comm under mpirun with 2 ranks: both on cpu:0 (`cpu`), or rank 0 on cpu:0 and rank 1 on PoCL (`pocl`); exit 77 with the reason where mpirun is missing.
# Usage: run.sh TEST_COMM_EXECUTABLE cpu|pocl
exe=$1
pairing=$2
if ! command -v mpirun >/dev/null 2>&1; then
  echo "SKIP: mpirun not found (Debian: apt install openmpi-bin libopenmpi-dev)"
  exit 77
fi
# Open MPI refuses to run as root unless told; CI runs as root. Set here, for this run only.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# -x passes a variable to the ranks; each application context (split by ':') gets its own KILN_DEVICE.
case $pairing in
  cpu)
    exec mpirun -np 2 --oversubscribe -x KILN_DEVICE=cpu:0 "$exe" ;;
  pocl)
    exec mpirun --oversubscribe -np 1 -x KILN_DEVICE=cpu:0 "$exe" : -np 1 -x KILN_DEVICE='opencl:cpu' "$exe" ;;
  *)
    echo "run.sh: unknown pairing '$pairing'; use cpu or pocl" >&2
    exit 2 ;;
esac
