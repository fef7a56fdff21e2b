// ftctl logs ID [-f] [--tail BYTES]
#include <iostream>

#include "client/commands.h"

namespace ftd::client {

Command AddLogs(CLI::App& app) {
  auto req = std::make_shared<ftd::v1::GetLogsRequest>();
  auto id = std::make_shared<std::string>();
  auto follow = std::make_shared<bool>(false);
  auto tail = std::make_shared<int64_t>(0);
  auto* c = app.add_subcommand("logs", "Print a job's log: the worker's output and its step lines");
  c->add_option("id", *id, "job id")->required();
  c->add_flag("-f,--follow", *follow, "keep printing what the job writes until it ends (Ctrl-C stops)");
  c->add_option("--tail", *tail, "only the last BYTES of the log (from a whole line)")->check(CLI::NonNegativeNumber);
  return {c, [req, id, follow, tail](Context& ctx) {
            req->set_id(*id);
            req->set_follow(*follow);
            req->set_tail_bytes(*tail);
            auto st = ctx.client().Logs(*req, [](const std::string& data) { std::cout << data << std::flush; });
            if (!st.ok()) return Fail(st);
            return kExitOk;
          }};
}

}  // namespace ftd::client
