#include "spec/paths.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "spec/spec.h"

namespace ftd::spec {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

bool NamedLikeAPath(const std::string& name) {
  auto ends = [&](const std::string& s) { return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0; };
  return name == "path" || name == "dir" || ends("_path") || ends("_dir");
}

void CollectPathLike(const Descriptor* d, const std::string& prefix, std::vector<std::string>* out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    const std::string name = prefix + f->name();
    if (f->type() == FieldDescriptor::TYPE_MESSAGE && !f->is_map()) {
      CollectPathLike(f->message_type(), name + ".", out);
    } else if (f->type() == FieldDescriptor::TYPE_STRING && NamedLikeAPath(f->name())) {
      out->push_back(name);
    }
  }
}

TEST(SpecPaths, TheListNamesEveryPathField) {
  std::vector<std::string> path_like;
  CollectPathLike(ftd::v1::TrainSpec::descriptor(), "", &path_like);
  ASSERT_FALSE(path_like.empty());
  const auto& listed = SpecPathFields();
  for (const auto& name : path_like) {
    EXPECT_NE(std::find(listed.begin(), listed.end(), name), listed.end()) << name << " is missing from SpecPathFields";
  }
}

TEST(SpecPaths, RelativePathsBecomeAbsoluteAgainstTheBase) {
  auto spec = ParseTrainSpecJson(R"({"model": {"config_path": "m/config.json", "weights_path": "/abs/w"},
      "data": {"path": "./train.bin"}, "checkpoint": {"dir": "../ck"},
      "lora": {"adapter_path": "adapters/a1"}})");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(ResolveSpecPaths("/home/u/run", &*spec).ok());
  EXPECT_EQ(spec->model().config_path(), "/home/u/run/m/config.json");
  EXPECT_EQ(spec->model().weights_path(), "/abs/w");
  EXPECT_EQ(spec->data().path(), "/home/u/run/train.bin");
  EXPECT_EQ(spec->checkpoint().dir(), "/home/u/ck");
  EXPECT_EQ(spec->lora().adapter_path(), "/home/u/run/adapters/a1");
}

TEST(SpecPaths, UnsetAndEmptyFieldsStayUnset) {
  auto spec = ParseTrainSpecJson(R"({"data": {"path": ""}, "steps": 3})");
  ASSERT_TRUE(spec.ok());
  ASSERT_TRUE(ResolveSpecPaths("/base", &*spec).ok());
  EXPECT_EQ(spec->data().path(), "");
  EXPECT_FALSE(spec->has_model());
  EXPECT_FALSE(spec->model().has_config_path());
  EXPECT_FALSE(spec->has_lora());  // resolving must not make LoRA present (presence means LoRA)
}

TEST(SpecPaths, ARelativeBaseIsRefused) {
  ftd::v1::TrainSpec spec;
  EXPECT_EQ(ResolveSpecPaths("relative", &spec).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ftd::spec
