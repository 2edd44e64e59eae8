// One pass over a block of whole FASTA records: the letters of every sequence, back to back, and where
// each record's id lies, for swcli/fasta.py. The block holds its records from the '>' of the first to
// the end of the last, with newlines already '\n' (the reader translates "\r\n" and lone '\r', as a
// text-mode read would).
//
// The fast rules are Biopython's SimpleFastaParser for plain text: the id is the header up to the first
// space or tab; spaces and line ends inside a sequence are dropped. A record the fast rules may get
// wrong is flagged, and the reader parses it again in Python with Biopython's exact rules (rstrip of
// every line, Unicode whitespace, UTF-8): one whose header starts with a blank or is empty, or holds a
// control character other than tab or a non-ASCII byte, or whose sequence holds any control character
// (a tab among them: rstrip drops it at the end of a line, not inside one) or a non-ASCII byte.
#include <cstdint>
#include <cstring>

namespace {

inline bool odd_in_header(uint8_t c) { return (c < 32 && c != '\t') || c >= 127; }

// Whether a line holds any byte but a printable, non-space ASCII one: a branch-free reduction that the
// compiler vectorises, so a plain line costs a compare per byte and then one memcpy.
inline bool plain(const uint8_t* line, int64_t size) {
  uint8_t other = 0;
  for (int64_t k = 0; k < size; ++k) other |= static_cast<uint8_t>(line[k] - 33) > 93;
  return !other;
}

}  // namespace

// Returns the number of records, or -1 if there are more than `capacity`. residues must hold `size`
// bytes; residue_ends, id_starts, id_ends and exact `capacity` entries each.
extern "C" int64_t swcli_scan_fasta(const uint8_t* data, int64_t size, uint8_t* residues,
                                    int64_t* residue_ends, int64_t* id_starts, int64_t* id_ends,
                                    uint8_t* exact, int64_t capacity) {
  int64_t p = 0, records = 0, kept = 0;
  while (p < size) {
    if (records == capacity) return -1;
    // The header: data[p] is '>', the line runs to the next '\n' or the end of the block.
    const void* newline = std::memchr(data + p, '\n', size - p);
    const int64_t header_end = newline ? static_cast<const uint8_t*>(newline) - data : size;
    const int64_t id_start = p + 1;
    uint8_t flag = id_start >= header_end || data[id_start] == ' ' || data[id_start] == '\t';
    int64_t id_end = id_start;
    while (id_end < header_end && data[id_end] != ' ' && data[id_end] != '\t') {
      flag |= odd_in_header(data[id_end]);
      ++id_end;
    }
    for (int64_t q = id_end; q < header_end; ++q) flag |= odd_in_header(data[q]);
    p = header_end + 1;
    // The sequence: every line up to the next one that starts with '>'.
    while (p < size && data[p] != '>') {
      const void* line_end_at = std::memchr(data + p, '\n', size - p);
      const int64_t line_end = line_end_at ? static_cast<const uint8_t*>(line_end_at) - data : size;
      if (plain(data + p, line_end - p)) {
        std::memcpy(residues + kept, data + p, line_end - p);
        kept += line_end - p;
      } else {
        for (int64_t q = p; q < line_end; ++q) {
          const uint8_t c = data[q];
          flag |= c < 32 || c >= 127;
          residues[kept] = c;
          kept += c != ' ';
        }
      }
      p = line_end + 1;
    }
    residue_ends[records] = kept;
    id_starts[records] = id_start;
    id_ends[records] = id_end;
    exact[records] = flag;
    ++records;
  }
  return records;
}
