// Each call's authentication and audit (CallAuth, auth.h): the interceptor that establishes the
// caller from the transport before any handler runs and keeps it for the handler, admits the call
// against the per-user limits, and appends every mutating call to the audit log with its target,
// its plain fields and its outcome.
#include "server/auth/auth.h"

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "proto/grpc_status.h"
#include "server/common/log.h"

namespace ftd::server {

namespace {

// The audit record's target (a job or token id) and detail (the request's plain fields).
void DescribeMessage(const google::protobuf::Message* pm, bool request, std::string* target, std::string* detail) {
  if (pm == nullptr) return;
  const auto* refl = pm->GetReflection();
  if (!request) {
    // The id of what the call made or changed: SubmitJobResponse.job, CreateTokenResponse.token, Job, Token.
    for (const char* field : {"job", "token"}) {
      const auto* f = pm->GetDescriptor()->FindFieldByName(field);
      if (f != nullptr && f->type() == google::protobuf::FieldDescriptor::TYPE_MESSAGE && refl->HasField(*pm, f)) {
        pm = &refl->GetMessage(*pm, f);
        refl = pm->GetReflection();
        break;
      }
    }
  }
  if (const auto* f = pm->GetDescriptor()->FindFieldByName("id");
      f != nullptr && f->type() == google::protobuf::FieldDescriptor::TYPE_STRING && !f->is_repeated()) {
    if (std::string id = refl->GetString(*pm, f); !id.empty()) *target = id.substr(0, 64);
  }
  if (!request) return;
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  refl->ListFields(*pm, &fields);
  for (const auto* f : fields) {
    if (f->is_repeated() || f->name() == "id" || f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE ||
        f->type() == google::protobuf::FieldDescriptor::TYPE_BYTES) {
      continue;
    }
    std::string v;
    switch (f->cpp_type()) {
      case google::protobuf::FieldDescriptor::CPPTYPE_STRING: v = refl->GetString(*pm, f); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_ENUM: v = refl->GetEnum(*pm, f)->name(); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_INT32: v = absl::StrCat(refl->GetInt32(*pm, f)); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_INT64: v = absl::StrCat(refl->GetInt64(*pm, f)); break;
      case google::protobuf::FieldDescriptor::CPPTYPE_BOOL: v = refl->GetBool(*pm, f) ? "true" : "false"; break;
      default: continue;
    }
    if (v.size() > 64) v = v.substr(0, 64) + "...";
    for (char& c : v) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
    }
    absl::StrAppend(detail, detail->empty() ? "" : " ", f->name(), "=", v);
  }
}

}  // namespace

// One call's authentication and audit. Hooks: the initial metadata arrives (the caller is
// established), the handler runs (and describes the call, handler.h), the status leaves (the audit
// record is written).
class AuthInterceptor final : public grpc::experimental::Interceptor {
 public:
  AuthInterceptor(CallAuth* owner, grpc::experimental::ServerRpcInfo* info)
      : owner_(owner), info_(info), method_(info->method()), audited_(CallAuth::IsMutating(method_)) {}
  ~AuthInterceptor() override { owner_->Forget(info_->server_context(), this); }

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    using H = grpc::experimental::InterceptionHookPoints;
    if (m->QueryInterceptionHookPoint(H::POST_RECV_INITIAL_METADATA)) Authenticate(m);
    if (audited_ && m->QueryInterceptionHookPoint(H::PRE_SEND_STATUS)) Record(m->GetSendStatus());
    m->Proceed();
  }

 private:
  void Authenticate(grpc::experimental::InterceptorBatchMethods* m) {
    grpc::ServerContextBase* ctx = info_->server_context();
    Authenticator::Presented p;
    p.peer = ctx->peer();
    auto* md = m->GetRecvInitialMetadata();
    if (auto it = md->find("authorization"); it != md->end()) {
      p.authorization = std::string(it->second.data(), it->second.size());
      md->erase("authorization");  // handlers never see the secret
    }
    if (auto ac = ctx->auth_context(); ac != nullptr && ac->IsPeerAuthenticated()) {
      for (const auto& cn : ac->FindPropertyValues("x509_common_name")) p.cert_cn.assign(cn.data(), cn.size());
    }
    who_ = owner_->auth_->Authenticate(p);
    peer_ = p.peer;
    owner_->Register(ctx, this, who_, audited_, Action());
  }

  std::string Action() const { return method_.substr(method_.rfind('/') + 1); }

  void Record(const grpc::Status& st) {
    if (!who_.ok()) {
      // Refused for want of credentials: nothing was parsed or done; counted per peer, a few records a minute.
      owner_->refused_.Refused(peer_, Action(), st.error_message());
      return;
    }
    ftd::v1::AuditRecord r;
    r.set_unix_ms(owner_->clock_->UnixMs());
    if (who_.ok()) {
      r.set_user(who_->user());
      r.set_role(who_->role());
      r.set_via(who_->via());
      r.set_peer(who_->peer());
    } else {
      r.set_peer(peer_);
    }
    r.set_action(Action());
    auto described = owner_->DescribedCall(info_->server_context(), this);
    r.set_target(described.target);
    r.set_detail(described.detail);
    r.set_code(std::string(absl::StatusCodeToString(FromGrpc(st).code())));
    if (!st.ok()) r.set_message(st.error_message().substr(0, 500));
    const absl::Status s = described.audit_seq > 0 ? owner_->audit_->FinishAudit(described.audit_seq, std::move(r))
                                                   : owner_->audit_->Audit(std::move(r));
    if (!s.ok()) FtdLog() << "audit log: " << s.message();
  }

  CallAuth* owner_;
  grpc::experimental::ServerRpcInfo* info_;
  std::string method_;
  bool audited_;
  absl::StatusOr<Identity> who_ = absl::UnauthenticatedError("the call was not authenticated");
  std::string peer_;
};

namespace {

class Factory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit Factory(CallAuth* a) : a_(a) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new AuthInterceptor(a_, info);
  }

 private:
  CallAuth* a_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> CallAuth::InterceptorFactory() {
  return std::make_unique<Factory>(this);
}

bool CallAuth::IsMutating(const std::string& method) {
  if (!absl::StartsWith(method, "/ftd.v1.")) return false;
  const std::string name = method.substr(method.rfind('/') + 1);
  for (const char* read : {"Get", "List", "Watch"}) {
    if (absl::StartsWith(name, read)) return false;
  }
  return name != "WhoAmI";
}

void CallAuth::Register(const grpc::ServerContextBase* ctx, const void* by, absl::StatusOr<Identity> who,
                        bool audited, std::string action) {
  std::lock_guard<std::mutex> l(mu_);
  calls_.insert_or_assign(ctx, Call{by, std::move(who), audited, std::move(action), "", "", 0});
}

absl::Status CallAuth::BeginAudit(const grpc::ServerContextBase* ctx) const {
  ftd::v1::AuditRecord r;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = calls_.find(ctx);
    if (it == calls_.end() || !it->second.audited || !it->second.who.ok()) return absl::OkStatus();
    const Identity& who = *it->second.who;
    r.set_user(who.user());
    r.set_role(who.role());
    r.set_via(who.via());
    r.set_peer(who.peer());
    r.set_action(it->second.action);
  }
  r.set_unix_ms(clock_->UnixMs());
  r.set_code("UNKNOWN");
  r.set_message("the call's outcome is not recorded: it was still running, or ftd could not write it");
  auto seq = audit_->BeginAudit(std::move(r));
  if (!seq.ok()) {
    FtdLog() << "audit log: " << seq.status().message() << "; refusing the call";
    const std::string msg = absl::StrCat("not done: ftd records every change in its audit log first, and cannot "
                                         "write it now: ", seq.status().message());
    return absl::IsResourceExhausted(seq.status()) ? absl::ResourceExhaustedError(msg) : absl::UnavailableError(msg);
  }
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = calls_.find(ctx); it != calls_.end()) it->second.audit_seq = *seq;
  return absl::OkStatus();
}

void CallAuth::Describe(const grpc::ServerContextBase* ctx, const google::protobuf::Message* req,
                        const google::protobuf::Message* resp) const {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = calls_.find(ctx);
    if (it == calls_.end() || !it->second.audited) return;
  }
  std::string target, detail, resp_target;
  DescribeMessage(req, true, &target, &detail);
  DescribeMessage(resp, false, &resp_target, &detail);
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = calls_.find(ctx); it != calls_.end()) {
    it->second.target = resp_target.empty() ? target : resp_target;
    it->second.detail = detail;
  }
}

CallAuth::Described CallAuth::DescribedCall(const grpc::ServerContextBase* ctx, const void* by) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = calls_.find(ctx);
  if (it == calls_.end() || it->second.by != by) return {};
  return {it->second.target, it->second.detail, it->second.audit_seq};
}

void CallAuth::Forget(const grpc::ServerContextBase* ctx, const void* by) {
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = calls_.find(ctx); it != calls_.end() && it->second.by == by) calls_.erase(it);
}

absl::StatusOr<CallLimiter::Lease> CallAuth::Admit(const grpc::ServerContextBase* ctx, const Identity& who,
                                                   bool stream) const {
  if (limits_ == nullptr) return CallLimiter::Lease();
  return limits_->Admit(who.user(), ctx->peer(), stream, who.role() == ftd::v1::ROLE_ADMIN);
}

absl::StatusOr<Identity> CallAuth::Caller(const grpc::ServerContextBase* ctx) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = calls_.find(ctx);
  if (it == calls_.end()) return absl::UnauthenticatedError("the call was not authenticated");
  return it->second.who;
}

}  // namespace ftd::server
