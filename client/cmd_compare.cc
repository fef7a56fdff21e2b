// ftctl compare A B [--top N] [-o table|json|yaml]: two PROFILE jobs side by side per op.
#include <iostream>

#include "client/commands.h"
#include "client/output.h"
#include "client/render.h"

namespace ftd::client {

Command AddCompare(CLI::App& app) {
  struct CompareFlags {
    std::string a, b;
    int top = 25;
    OutputFormat output = OutputFormat::kTable;
  };
  auto f = std::make_shared<CompareFlags>();
  auto* c = app.add_subcommand("compare", "Two PROFILE jobs side by side per op (time, calls, difference)");
  c->add_option("a", f->a, "job id A (e.g. the eager run)")->required();
  c->add_option("b", f->b, "job id B (e.g. the fused run)")->required();
  c->add_option("--top", f->top, "rows (0: all)")->check(WholeNumberAtLeast(0));
  AddOutputFlag(c, &f->output);
  return {c, [f](Context& ctx) {
            auto a = FetchProfile(ctx.client(), f->a);
            if (!a.ok()) return Fail(a.status());
            auto b = FetchProfile(ctx.client(), f->b);
            if (!b.ok()) return Fail(b.status());
            std::cout << (f->output == OutputFormat::kTable ? CompareTable(f->a, *a, f->b, *b, f->top)
                                                            : Emit(CompareJson(f->a, *a, f->b, *b, f->top), f->output));
            return kExitOk;
          }};
}

}  // namespace ftd::client
