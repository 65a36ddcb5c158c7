#include "megaton/core/threads.h"

#include <cblas.h>
#include <omp.h>

#include "megaton/core/error.h"

namespace megaton {

void set_num_threads(int n) {
  if (n <= 0) n = omp_get_max_threads();
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

void release_idle_threads() {
  if (omp_pause_resource_all(omp_pause_soft) != 0) fail("releasing the idle OpenMP threads failed");
}

}  // namespace megaton
