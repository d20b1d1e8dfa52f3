// `safetensors_copy IN OUT`: reads IN (f32, f16 or bf16), prints each tensor as one JSON line
// ({"name", "dtype", "shape", "values"}) and writes its tensors to OUT as f32 with IN's
// metadata plus "copied_by": "tandem". For runtime/safetensors_format_test.py, which checks
// both directions against a writer and a reader of its own.
#include <cstdio>

#include "runtime/json.h"
#include "runtime/safetensors.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: safetensors_copy IN OUT\n");
    return 2;
  }
  absl::StatusOr<tandem::SafetensorsFile> f = tandem::ReadSafetensors(argv[1]);
  if (!f.ok()) {
    std::fprintf(stderr, "%s\n", std::string(f.status().message()).c_str());
    return 1;
  }
  for (const tandem::SafetensorsTensor& t : f->tensors) {
    tandem::Json line = {{"name", t.name}, {"dtype", t.dtype}, {"shape", t.shape}};
    tandem::Json values = tandem::Json::array();
    for (float v : t.values) values.push_back(tandem::JsonFloat(v));
    line["values"] = values;
    std::printf("%s\n", tandem::JsonText(line, tandem::JsonLayout::kLine).c_str());
  }
  f->metadata["copied_by"] = "tandem";
  if (absl::Status s = tandem::WriteSafetensors(argv[2], *f); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
