/* A preload library that does nothing: the mutation check's stand-in for libcushim.so.
 *
 * With CUSHIM_TEST_SHIM pointing at this library, every test that preloads "the shim" loads
 * this instead. It exports no CUDA entry point and no cushim API, so every call goes straight
 * to simcuda: a shim test that still passes against it cannot tell whether the shim served
 * the call (see tests/shim_mutation.rs). The constructor only makes it a real preload that
 * runs code at load, as the shim does. */
static volatile int stand_in_loaded;

__attribute__((constructor)) static void stand_in_init(void) { stand_in_loaded = 1; }
