/* tests/conformance.c: placeholder while the suite is written. */
#include <stdio.h>
int main(void) {
  puts("not written yet");
  return 77;
}
