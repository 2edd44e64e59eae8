// Compile-time dispatch: the runtime values of a call mapped to the template instantiations of its
// kernels, in the style of flash-attention's static_switch.h. Each macro runs its last argument, a
// lambda, with NAME a constant of the value taken, and returns what the lambda returns:
//
//     return SWCLI_BOOL_SWITCH(t > 0, SOFT, [&] { return launch<SOFT>(call); });
//
// Every branch is compiled, so a macro instantiates its lambda for each value it names, and only those:
// the columns switches name the lane widths their kernels are built for, and a value outside them takes
// the last (4 columns per lane).
#pragma once

// NAME: true where COND holds, else false.
#define SWCLI_BOOL_SWITCH(COND, NAME, ...) \
  [&] {                                    \
    if (COND) {                            \
      constexpr static bool NAME = true;   \
      return __VA_ARGS__();                \
    } else {                               \
      constexpr static bool NAME = false;  \
      return __VA_ARGS__();                \
    }                                      \
  }()

// Columns per lane of the dense kernels and of the table's backward: 1, else 4.
#define SWCLI_COLUMNS_1_4_SWITCH(COLUMNS, NAME, ...) \
  [&] {                                              \
    if ((COLUMNS) == 1) {                            \
      constexpr static int NAME = 1;                 \
      return __VA_ARGS__();                          \
    } else {                                         \
      constexpr static int NAME = 4;                 \
      return __VA_ARGS__();                          \
    }                                                \
  }()

// Columns per lane of the codes kernels: 1, 8, else 4.
#define SWCLI_COLUMNS_1_4_8_SWITCH(COLUMNS, NAME, ...) \
  [&] {                                                \
    if ((COLUMNS) == 1) {                              \
      constexpr static int NAME = 1;                   \
      return __VA_ARGS__();                            \
    } else if ((COLUMNS) == 8) {                       \
      constexpr static int NAME = 8;                   \
      return __VA_ARGS__();                            \
    } else {                                           \
      constexpr static int NAME = 4;                   \
      return __VA_ARGS__();                            \
    }                                                  \
  }()

// The three cases of the rows kernels (rows.cuh, at kRowCols): rows that are not ALIGNED are always
// MASKED, so the fourth case is never built.
#define SWCLI_MASKED_ALIGNED_SWITCH(MASKED_COND, ALIGNED_COND, MASKED, ALIGNED, ...) \
  [&] {                                                                              \
    if (!(ALIGNED_COND)) {                                                           \
      constexpr static bool MASKED = true, ALIGNED = false;                          \
      return __VA_ARGS__();                                                          \
    } else if (MASKED_COND) {                                                        \
      constexpr static bool MASKED = true, ALIGNED = true;                           \
      return __VA_ARGS__();                                                          \
    } else {                                                                         \
      constexpr static bool MASKED = false, ALIGNED = true;                          \
      return __VA_ARGS__();                                                          \
    }                                                                                \
  }()

// The affine cell's form (AffineMode in affine.cuh): hard (t = 0), shared powers, else separate cells.
#define SWCLI_AFFINE_MODE_SWITCH(MODE_VALUE, NAME, ...) \
  [&] {                                                 \
    if ((MODE_VALUE) == 0) {                            \
      constexpr static int NAME = 0;                    \
      return __VA_ARGS__();                             \
    } else if ((MODE_VALUE) == 1) {                     \
      constexpr static int NAME = 1;                    \
      return __VA_ARGS__();                             \
    } else {                                            \
      constexpr static int NAME = 2;                    \
      return __VA_ARGS__();                             \
    }                                                   \
  }()
