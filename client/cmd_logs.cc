// ftctl logs ID [-f] [--tail LINES] [--tail-bytes BYTES]: a follow survives a daemon restart (it resumes at the byte offset
// after the last one printed).
#include <unistd.h>

#include <iostream>

#include "client/output.h"

#include "client/commands.h"

namespace ftd::client {

Command AddLogs(CLI::App& app) {
  auto req = std::make_shared<ftd::v1::GetLogsRequest>();
  auto id = std::make_shared<std::string>();
  auto follow = std::make_shared<bool>(false);
  auto tail = std::make_shared<int64_t>(0);
  auto tail_bytes = std::make_shared<int64_t>(0);
  auto* c = app.add_subcommand("logs", "Print a job's log: the worker's output and its step lines");
  c->add_option("id", *id, "job id")->required();
  c->add_flag("-f,--follow", *follow, "keep printing what the job writes until it ends (Ctrl-C stops)");
  // Lines, as kubectl logs --tail and tail -n count them.
  c->add_option("--tail", *tail, "only the last LINES of the log")->check(WholeNumberAtLeast(0));
  c->add_option("--tail-bytes", *tail_bytes, "only the last BYTES of the log (from a whole line)")
      ->check(WholeNumberAtLeast(0));
  return {c, [req, id, follow, tail, tail_bytes](Context& ctx) {
            req->set_id(*id);
            req->set_follow(*follow);
            req->set_tail_lines(*tail);
            req->set_tail_bytes(*tail_bytes);
            bool reconnecting = false;
            // On a terminal the log's control characters are shown as escapes (newlines and tabs pass);
            // into a pipe or a file it goes byte for byte.
            StreamPrinter out(std::cout, ::isatty(STDOUT_FILENO) == 1);
            auto st = ctx.client().Logs(
                *req, [&](const std::string& data) { out.Write(data); },
                [&](ConnectionEvent c, const std::string& why) {
                  if (c == ConnectionEvent::kLost && !reconnecting) {
                    std::cerr << "ftctl: lost the connection to ftd (" << why << "); reconnecting for up to "
                              << ctx.client().options().timeout.count() / 1000.0 << " s" << std::endl;
                  } else if (c == ConnectionEvent::kRestored && reconnecting) {
                    std::cerr << "ftctl: reconnected; the log goes on from where it stopped" << std::endl;
                  }
                  reconnecting = c == ConnectionEvent::kLost;
                });
            out.Finish();
            if (!st.ok()) return Fail(st);
            return kExitOk;
          }};
}

}  // namespace ftd::client
