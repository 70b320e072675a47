/* runtime/state.c: kiln's process-wide state (kiln__rt), a leaf that calls nothing: runtime.c starts and stops it, the other files read it. */
#include "runtime/internal.h"

#define KILN_STR_(x) #x
#define KILN_STR(x) KILN_STR_(x)

/* Zero until runtime.c's start fills it; zero again after its stop. */
kiln__runtime_t kiln__rt;

const char *kiln_version(void) {
  return KILN_STR(KILN_VERSION_MAJOR) "." KILN_STR(KILN_VERSION_MINOR) "." KILN_STR(KILN_VERSION_PATCH);
}
