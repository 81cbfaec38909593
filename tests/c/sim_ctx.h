/* The driver-API simcuda test programs' start: initialize the driver and make device 0's
 * primary context current (what the runtime does implicitly), failing the program through
 * EXPECT when any step fails. */
#ifndef SIM_CTX_H
#define SIM_CTX_H
#include <cuda.h>
#include "sim_check.h"

static void init_ctx(void) {
    CUdevice d;
    CUcontext c;
    EXPECT(CUDA_SUCCESS, cuInit(0));
    EXPECT(CUDA_SUCCESS, cuDeviceGet(&d, 0));
    EXPECT(CUDA_SUCCESS, cuDevicePrimaryCtxRetain(&c, d));
    EXPECT(CUDA_SUCCESS, cuCtxSetCurrent(c));
}
#endif
