// libFuzzer harness: a Megatron indexed dataset, PREFIX.idx then PREFIX.bin (split by the part
// separator), opened and every sequence read, as training and `data inspect` do.
#include "fuzz_input.h"
#include "megaton/data/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = megaton::fuzz::split_parts(data, size, 2);
  megaton::fuzz::write_scratch("data.idx", parts[0]);
  const std::string bin = megaton::fuzz::write_scratch("data.bin", parts[1]);
  megaton::fuzz::parse_or_reject([&] {
    const auto ds = megaton::data::IndexedDataset::open(bin.substr(0, bin.size() - 4));
    const auto docs = ds.document_indices();
    megaton::fuzz::require(docs.size() == ds.num_documents() + 1 && docs.back() == int64_t(ds.num_sequences()));
    for (size_t s = 0; s < ds.num_sequences(); ++s)
      megaton::fuzz::require(ds.get_int64(s).size() == ds.sequence_length(s));
  });
  return 0;
}
