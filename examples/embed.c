/* examples/embed.c: the smallest program that embeds kiln: add two tensors on the default device and print the result. */
#include <stdio.h>

#include <kiln/kiln.h>

int main(void) {
  kiln_device_t *device = NULL;
  kiln_tensor_t *a = NULL, *b = NULL, *c = NULL;
  const int64_t shape[1] = {4};
  float result[4];

  if (kiln_device_default(&device) != KILN_OK ||
      kiln_tensor_arange(device, KILN_F32, 0, 4, 1, &a) != KILN_OK ||
      kiln_tensor_full(device, KILN_F32, 1, shape, 10.0, &b) != KILN_OK ||
      kiln_tensor_add(a, b, &c) != KILN_OK ||
      kiln_tensor_read(c, result, sizeof result) != KILN_OK) {
    fprintf(stderr, "kiln: %s\n", kiln_last_error());
    return 1;
  }
  printf("%s: %g %g %g %g\n", kiln_device_name(device), result[0], result[1], result[2], result[3]);
  kiln_tensor_release(c);
  kiln_tensor_release(b);
  kiln_tensor_release(a);
  kiln_deinitialize();
  return 0;
}
