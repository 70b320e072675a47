/* kiln/kiln.h: the one header an application includes. */
#ifndef KILN_KILN_H
#define KILN_KILN_H

/* Rules that hold for the whole API.
 *
 * Status: every fallible call returns kiln_status_t; KILN_OK (0) is success.
 *   On failure kiln_last_error() gives the calling thread a message saying what
 *   failed, with the values involved, and what to do. Outputs (out_* / out)
 *   are written only on success. kiln never prints (unless KILN_LOG or
 *   kiln_log_set_level asks) and never aborts on bad input.
 *
 * Lifetime: objects shared by reference (device, buffer, queue, event, tensor)
 *   have retain/release; a create or an operation hands the caller one
 *   reference. release(NULL) is a no-op. Reference counts are atomic; every
 *   handle may be used from any thread unless its comment says otherwise.
 *   Devices are owned by kiln and live until kiln_deinitialize().
 *
 * Start-up: kiln starts itself on first use from the environment (KILN_*
 *   variables, docs/environment.md), or from kiln_initialize() with explicit
 *   settings.
 *
 * Asynchrony: enqueued work returns at once; each queue runs its work in
 *   order. Reading to the host, kiln_queue_finish and kiln_event_wait block.
 *   Work on two queues is ordered only through events.
 *
 * Devices: every tensor lives on exactly one device. Operands on two devices
 *   are an error (KILN_DEVICE_MISMATCH); kiln never copies implicitly.
 */

#include "kiln/status.h"
#include "kiln/runtime.h"
#include "kiln/device.h"
#include "kiln/queue.h"
#include "kiln/tensor.h"
#include "kiln/trace.h"

#endif /* KILN_KILN_H */
