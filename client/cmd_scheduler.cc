// ftctl pause | resume | scheduler: the daemon's scheduler, without a restart (admin).
#include <iostream>

#include "client/commands.h"

namespace ftd::client {

namespace {

Command SchedulerCommand(CLI::App& app, const char* name, const char* help, JobClient::SchedulerAction action) {
  auto* c = app.add_subcommand(name, help);
  return {c, [action](Context& ctx) {
            auto st = ctx.client().Scheduler(action);
            if (!st.ok()) return Fail(st.status());
            std::cout << "scheduler " << (st->paused() ? "paused: no queued job starts" : "running") << "; "
                      << st->busy() << " of " << st->slots() << " slot(s) busy, " << st->queued() << " job(s) queued"
                      << std::endl;
            return kExitOk;
          }};
}

}  // namespace

Command AddPause(CLI::App& app) {
  return SchedulerCommand(app, "pause", "Pause the scheduler: queued jobs wait, running ones go on (admin)",
                          JobClient::SchedulerAction::kPause);
}

Command AddResume(CLI::App& app) {
  return SchedulerCommand(app, "resume", "Resume the scheduler (admin)", JobClient::SchedulerAction::kResume);
}

Command AddScheduler(CLI::App& app) {
  return SchedulerCommand(app, "scheduler", "Show whether the scheduler is paused, and its slots",
                          JobClient::SchedulerAction::kGet);
}

}  // namespace ftd::client
