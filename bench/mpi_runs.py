"""What the multi-process benchmarks (dp_comm.py, pipeline_schedules.py) share: Open MPI's
environment for oversubscribed single-node runs as root, the mpirun prefix, and running a command
that must succeed."""
import os
import subprocess

MPI_ENV = {"OMPI_MCA_plm": "isolated", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
           "OMPI_MCA_rmaps_base_oversubscribe": "1", "OMPI_ALLOW_RUN_AS_ROOT": "1",
           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


# mpirun --bind-to policy: "none" unless MEGATON_MPI_BIND says otherwise (plan_validation.py pins a rank per core).
BIND = os.environ.get("MEGATON_MPI_BIND", "none")


def mpirun(np):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", BIND, "-np", str(np)]


def run(cmd, env):
    result = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(cmd)}\n{result.stdout[-3000:]}")
    return result.stdout
