// TSV rows `query target qlen tlen score` for a chunk of pairs, in bulk, for swcli/output.py.
//
// A score is written as swcli.output.format_score writes it: the shortest decimal that reads back as
// the same float32, laid out as C's %g with max(6, its digits) significant digits (so 308, 47.43803,
// 1e-05, 1.2345679e+09), and nan, inf, -inf.
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

namespace {

char* write_text(char* out, const uint8_t* text, int64_t size) {
  std::memcpy(out, text, size);
  return out + size;
}

char* write_integer(char* out, int64_t value) {
  return std::to_chars(out, out + 24, value).ptr;
}

char* write_score(char* out, float value) {
  if (std::isnan(value)) return write_text(out, reinterpret_cast<const uint8_t*>("nan"), 3);
  if (std::isinf(value)) {
    if (value < 0) *out++ = '-';
    return write_text(out, reinterpret_cast<const uint8_t*>("inf"), 3);
  }
  // The shortest round trip in scientific form: [-]d[.ddd]e(+|-)xx.
  char buffer[32];
  const char* end = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific).ptr;
  char digits[12];
  int count = 0;
  for (const char* p = buffer; *p != 'e'; ++p) count += *p >= '0' && *p <= '9';
  if (count < 6) {
    // %.6g: six digits, correctly rounded, trailing zeros dropped. For a normal float that is the
    // shortest form again; a subnormal one (fewer significant bits) can differ in its last digits.
    end = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific, 5).ptr;
  }
  const char* p = buffer;
  if (*p == '-') *out++ = *p++;
  count = 0;
  for (; *p != 'e'; ++p)
    if (*p != '.') digits[count++] = *p;
  while (count > 1 && digits[count - 1] == '0') --count;
  int exponent = 0;
  std::from_chars(p[1] == '+' ? p + 2 : p + 1, end, exponent);
  const int precision = count > 6 ? count : 6;
  if (exponent >= -4 && exponent < precision) {  // %g's fixed form, trailing zeros dropped
    if (exponent < 0) {
      *out++ = '0';
      *out++ = '.';
      for (int k = -1; k > exponent; --k) *out++ = '0';
      return write_text(out, reinterpret_cast<const uint8_t*>(digits), count);
    }
    for (int k = 0; k <= exponent; ++k) *out++ = k < count ? digits[k] : '0';
    if (count > exponent + 1) {
      *out++ = '.';
      out = write_text(out, reinterpret_cast<const uint8_t*>(digits + exponent + 1), count - exponent - 1);
    }
    return out;
  }
  *out++ = digits[0];  // %g's exponent form: at least two exponent digits
  if (count > 1) {
    *out++ = '.';
    out = write_text(out, reinterpret_cast<const uint8_t*>(digits + 1), count - 1);
  }
  *out++ = 'e';
  *out++ = exponent < 0 ? '-' : '+';
  const int magnitude = exponent < 0 ? -exponent : exponent;
  if (magnitude < 10) *out++ = '0';
  return std::to_chars(out, out + 4, magnitude).ptr;
}

}  // namespace

// Row k: query id query_index[k] (bytes query_ids[query_id_offsets[i] .. query_id_offsets[i + 1])),
// target id target_index[k] likewise, qlen[k], tlen[k], scores[k]. Returns the bytes written, or -1 if
// they would pass `capacity` (the caller's bound: the ids' bytes plus 80 per row).
extern "C" int64_t swcli_tsv_rows(int64_t rows, const uint8_t* query_ids, const int64_t* query_id_offsets,
                                  const int64_t* query_index, const uint8_t* target_ids,
                                  const int64_t* target_id_offsets, const int64_t* target_index,
                                  const int64_t* qlen, const int64_t* tlen, const float* scores, char* out,
                                  int64_t capacity) {
  char* const start = out;
  for (int64_t k = 0; k < rows; ++k) {
    const int64_t q = query_index[k], t = target_index[k];
    const int64_t q_size = query_id_offsets[q + 1] - query_id_offsets[q];
    const int64_t t_size = target_id_offsets[t + 1] - target_id_offsets[t];
    if ((out - start) + q_size + t_size + 80 > capacity) return -1;
    out = write_text(out, query_ids + query_id_offsets[q], q_size);
    *out++ = '\t';
    out = write_text(out, target_ids + target_id_offsets[t], t_size);
    *out++ = '\t';
    out = write_integer(out, qlen[k]);
    *out++ = '\t';
    out = write_integer(out, tlen[k]);
    *out++ = '\t';
    out = write_score(out, scores[k]);
    *out++ = '\n';
  }
  return out - start;
}

// TSV rows of any columns, for swcli/details.py's --format-output. Column c has kinds[c]:
//   0 text: row k is the bytes texts[c][offsets[c][r] .. offsets[c][r + 1]) of entry r = index[c][k] (index
//     null: r = k);
//   1 an int64, values[c][k];
//   2 a float32 score, written as swcli_tsv_rows writes scores;
//   3 a float64 with precision[c] decimals (%.*f);
//   4 a float64 with precision[c] significant digits (%.*g).
// Returns the bytes written, or -1 if they would pass `capacity` (the caller's bound: the text bytes plus
// 66 per other column, and one per column, per row).
extern "C" int64_t swcli_tsv_columns(int64_t rows, int64_t columns, const int64_t* kinds, const void* const* values,
                                     const int64_t* const* offsets, const int64_t* const* index,
                                     const int64_t* precision, char* out, int64_t capacity) {
  char* const start = out;
  for (int64_t k = 0; k < rows; ++k) {
    for (int64_t c = 0; c < columns; ++c) {
      if (c > 0) *out++ = '\t';
      if (kinds[c] == 0) {
        const int64_t r = index[c] ? index[c][k] : k;
        const int64_t size = offsets[c][r + 1] - offsets[c][r];
        if ((out - start) + size + 2 > capacity) return -1;
        out = write_text(out, static_cast<const uint8_t*>(values[c]) + offsets[c][r], size);
        continue;
      }
      if ((out - start) + 66 > capacity) return -1;
      if (kinds[c] == 1) {
        out = write_integer(out, static_cast<const int64_t*>(values[c])[k]);
      } else if (kinds[c] == 2) {
        out = write_score(out, static_cast<const float*>(values[c])[k]);
      } else {
        const double value = static_cast<const double*>(values[c])[k];
        const int digits = static_cast<int>(precision[c]);
        int written = std::snprintf(out, 65, kinds[c] == 3 ? "%.*f" : "%.*g", digits, value);
        if (written > 64) written = std::snprintf(out, 65, "%.17g", value);  // a huge value: exponent form
        out += written;
      }
    }
    *out++ = '\n';
  }
  return out - start;
}
