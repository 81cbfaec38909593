/* simcuda's cuda_runtime.h: the runtime API (no device-code support). */
#ifndef SIMCUDA_CUDA_RUNTIME_H
#define SIMCUDA_CUDA_RUNTIME_H
#define __CUDA_RUNTIME_H__
#include "cuda_runtime_api.h"
#endif
