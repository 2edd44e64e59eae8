// The text columns of alignments (swcli/details.py) from the operations of traceback.cpp: the CIGAR
// and the aligned query and target, in bulk. An empty alignment is written "*", as SAM writes a
// missing CIGAR or sequence.
#include <charconv>
#include <cstdint>

// CIGAR strings ("12M2I30M"): pair k's text is out[out_offsets[k] .. out_offsets[k + 1]). out has room
// for 2 * sum(op_lengths) + pairs bytes (a run of r operations takes at most 2r characters).
extern "C" void swcli_cigars(int64_t pairs, const char* ops, const int64_t* op_offsets, const int64_t* op_lengths,
                             char* out, int64_t* out_offsets) {
  int64_t at = 0;
  out_offsets[0] = 0;
  for (int64_t k = 0; k < pairs; ++k) {
    const char* op = ops + op_offsets[k];
    const int64_t n = op_lengths[k];
    if (n == 0) out[at++] = '*';
    for (int64_t start = 0; start < n;) {
      int64_t end = start + 1;
      while (end < n && op[end] == op[start]) ++end;
      at = std::to_chars(out + at, out + at + 20, end - start).ptr - out;
      out[at++] = op[start];
      start = end;
    }
    out_offsets[k + 1] = at;
  }
}

// One side of each alignment, with '-' against gaps: the letters of codes[starts[k] + first[k] ..] through
// `letters` (the matrix's alphabet), one per operation; `own` is the operation that consumes a residue of
// this side alone ('I' for the query, 'D' for the target), the other one is a gap. Pair k's text is
// out[out_offsets[k] ..] (op_lengths[k] bytes, or 1 for "*").
extern "C" void swcli_aligned_text(int64_t pairs, const char* ops, const int64_t* op_offsets,
                                   const int64_t* op_lengths, const uint8_t* codes, const int64_t* starts,
                                   const int64_t* first, const char* letters, char own, char* out,
                                   const int64_t* out_offsets) {
  for (int64_t k = 0; k < pairs; ++k) {
    const char* op = ops + op_offsets[k];
    const uint8_t* residue = codes + starts[k] + first[k];
    char* text = out + out_offsets[k];
    const int64_t n = op_lengths[k];
    if (n == 0) text[0] = '*';
    for (int64_t m = 0; m < n; ++m) text[m] = op[m] == 'M' || op[m] == own ? letters[*residue++] : '-';
  }
}
