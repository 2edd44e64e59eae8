// Letters -> codes through a matrix's 256-entry table, for swcli/scoring.py: one pass that writes the
// codes and notes whether any letter is not scored; a second pass finds the first only then.
#include <cstdint>

// Codes of `size` letters through a 256-entry table; returns the index of the first letter whose code
// is `invalid`, or -1.
extern "C" int64_t swcli_encode(const uint8_t* __restrict letters, int64_t size, const uint8_t* __restrict table,
                                uint8_t invalid, uint8_t* __restrict codes) {
  uint8_t seen = 0;
  for (int64_t k = 0; k < size; ++k) {
    const uint8_t code = table[letters[k]];
    codes[k] = code;
    seen |= code == invalid;
  }
  if (!seen) return -1;
  for (int64_t k = 0; k < size; ++k)
    if (codes[k] == invalid) return k;
  return -1;
}
