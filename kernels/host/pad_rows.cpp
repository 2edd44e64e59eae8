// Padded (rows, width) code rows gathered from codes stored back to back, for swcli/batching.py on the
// CPU (on a GPU the same gather runs as tensor operations on the device): one copy and one fill a row.
#include <cstdint>
#include <cstring>

extern "C" void swcli_pad_rows(const uint8_t* flat, const int64_t* starts, const int64_t* lengths, int64_t rows,
                               int64_t width, uint8_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = out + r * width;
    std::memcpy(row, flat + starts[r], lengths[r]);
    std::memset(row + lengths[r], 0, width - lengths[r]);
  }
}
