/* tests/test_bad_input.c: placeholder while the suite is written. */
#include <stdio.h>
int main(void) {
  puts("not written yet");
  return 77;
}
