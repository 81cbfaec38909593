/* Shared checking macros for the simcuda test programs: EXPECT(code, call) fails the
 * program (exit 1) with a message naming the call when the call returns another code. */
#ifndef SIM_CHECK_H
#define SIM_CHECK_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define EXPECT(want, call) do { int got_ = (int)(call); if (got_ != (int)(want)) { \
    fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, got_, (int)(want)); \
    exit(1); } } while (0)
#define REQUIRE(cond) do { if (!(cond)) { \
    fprintf(stderr, "%s:%d: requirement failed: %s\n", __FILE__, __LINE__, #cond); exit(1); } } while (0)
#define CASE(name) if (!strcmp(argv[1], name))
#endif
