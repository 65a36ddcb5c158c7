// The command prefix that starts `np` ranks of a program under mpirun from a test, with the
// container settings of tests/CMakeLists.txt (MEGATON_MPI_ENV), one OpenMP thread per rank, and
// `timeout`, so that a hung job fails the test (exit 124) instead of blocking the suite.
#pragma once
#include <string>

namespace megaton::testing {

// The environment for a command that starts mpirun itself (`megaton train --nproc N`): ranks not
// bound to cores, like --bind-to none.
inline std::string mpi_environment() {
  return std::string("env ") + MEGATON_MPI_ENV + " OMP_NUM_THREADS=1 OMPI_MCA_hwloc_base_binding_policy=none ";
}

// The same with a timeout.
inline std::string mpi_env(int timeout_s = 60) { return "timeout -k 5 " + std::to_string(timeout_s) + " " + mpi_environment(); }

inline std::string mpirun(int np, int timeout_s = 60) {
  return mpi_env(timeout_s) + MEGATON_MPIEXEC + " --allow-run-as-root --oversubscribe --bind-to none -np " +
         std::to_string(np) + " ";
}

}  // namespace megaton::testing
