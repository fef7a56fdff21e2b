#include "server/auth.h"

#include <fcntl.h>
#include <grpcpp/server_posix.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/message.h"
#include "proto/grpc_status.h"

namespace ftd::server {

namespace {

constexpr int kFirstConnFd = 100;  // connection descriptors are numbered upward from here (see Adopt)

ino_t InodeOf(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return st.st_ino;
}

}  // namespace

std::string LocalUserName(uid_t uid) {
  struct passwd pw {};
  struct passwd* out = nullptr;
  char buf[4096];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &out) == 0 && out != nullptr) return out->pw_name;
  return absl::StrCat("uid:", uid);
}

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Listen(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrCat("--socket \"", path, "\" must be a path of 1 to ",
                                                   sizeof addr.sun_path - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  std::unique_ptr<UnixListener> l(new UnixListener());
  l->path_ = path;
  l->fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l->fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", strerror(errno)));
  // A socket file left by a daemon that died is replaced; one a live daemon answers on is not.
  if (int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); probe >= 0) {
    const bool live = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(probe);
    if (live) {
      return absl::AlreadyExistsError(absl::StrCat("another ftd listens on --socket ", path, " already"));
    }
  }
  ::unlink(path.c_str());
  // Any local user may connect (identity is the peer's uid): 0666, set after bind, so that the
  // socket is never more open than that (the umask may make it less open until then).
  if (::bind(l->fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::chmod(path.c_str(), 0666) != 0 ||
      ::listen(l->fd_, 128) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("cannot listen on --socket ", path, ": ", strerror(errno)));
  }
  return l;
}

UnixListener::~UnixListener() {
  Stop();
  if (fd_ >= 0) ::close(fd_);
}

void UnixListener::Serve(grpc::Server* server) {
  thread_ = std::thread([this, server] { Loop(server); });
}

void UnixListener::Stop() {
  if (stop_.exchange(true)) return;
  ::shutdown(fd_, SHUT_RDWR);  // wakes accept()
  if (thread_.joinable()) thread_.join();
  ::unlink(path_.c_str());
}

// Moves an accepted descriptor to a number above every one handed out before (wrapping at the
// descriptor limit), so that "fd:N" names one connection for a long time, not the next one the
// kernel gives the lowest free number; the inode check in PeerOf covers the wrap.
int UnixListener::Adopt(int fd) {
  if (next_fd_ < kFirstConnFd) next_fd_ = kFirstConnFd;
  int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, next_fd_);
  if (moved < 0) moved = ::fcntl(fd, F_DUPFD_CLOEXEC, kFirstConnFd);
  if (moved < 0) return fd;
  ::close(fd);
  next_fd_ = moved + 1;
  return moved;
}

void UnixListener::Loop(grpc::Server* server) {
  while (!stop_) {
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (stop_) return;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      std::cerr << "ftd: accept on " << path_ << ": " << strerror(errno) << std::endl;
      return;
    }
    Conn c;
    socklen_t len = sizeof c.cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &c.cred, &len) != 0) {
      ::close(fd);
      continue;
    }
    fd = Adopt(fd);
    c.inode = InodeOf(fd);
    {
      std::lock_guard<std::mutex> l(mu_);
      // Forget connections gRPC has closed since.
      for (auto it = conns_.begin(); it != conns_.end();) {
        it = InodeOf(it->first) == it->second.inode ? std::next(it) : conns_.erase(it);
      }
      conns_[fd] = c;
    }
    grpc::AddInsecureChannelFromFd(server, fd);
  }
}

std::optional<ucred> UnixListener::PeerOf(const std::string& grpc_peer) const {
  int fd = -1;
  if (!absl::StartsWith(grpc_peer, "fd:") || !absl::SimpleAtoi(grpc_peer.substr(3), &fd)) return std::nullopt;
  std::lock_guard<std::mutex> l(mu_);
  auto it = conns_.find(fd);
  if (it == conns_.end() || InodeOf(fd) != it->second.inode) return std::nullopt;
  return it->second.cred;
}

Identity Authenticator::Local(const ucred& c) const {
  Identity id;
  id.set_user(LocalUserName(c.uid));
  const bool admin = c.uid == 0 || c.uid == cfg_.daemon_uid || cfg_.admins.count(id.user()) > 0;
  id.set_role(admin ? ftd::v1::ROLE_ADMIN : ftd::v1::ROLE_USER);
  id.set_via(absl::StrCat("unix socket uid ", c.uid));
  id.set_peer(absl::StrCat("local uid ", c.uid, " pid ", c.pid));
  id.set_local_uid(c.uid);
  return id;
}

absl::StatusOr<Identity> Authenticator::Authenticate(const Presented& p) const {
  if (p.authorization) {
    const std::string kBearer = "Bearer ";
    if (!absl::StartsWith(*p.authorization, kBearer)) {
      return absl::UnauthenticatedError("the authorization header is not \"Bearer <token>\"");
    }
    auto t = tokens_->Verify(p.authorization->substr(kBearer.size()), clock_->UnixMs());
    if (!t.ok()) return t.status();
    Identity id;
    id.set_user(t->user());
    id.set_role(t->role());
    id.set_via(absl::StrCat("token ", t->id()));
    id.set_peer(p.peer);
    return id;
  }
  if (!p.cert_cn.empty()) {
    Identity id;
    if (auto st = ValidateUserName(p.cert_cn, "the client certificate's common name"); !st.ok()) {
      return absl::UnauthenticatedError(st.message());
    }
    id.set_user(p.cert_cn);
    id.set_role(cfg_.admins.count(p.cert_cn) > 0 ? ftd::v1::ROLE_ADMIN : ftd::v1::ROLE_USER);
    id.set_via(absl::StrCat("client certificate CN=", p.cert_cn));
    id.set_peer(p.peer);
    return id;
  }
  if (local_ != nullptr) {
    if (auto c = local_->PeerOf(p.peer)) return Local(*c);
  }
  return absl::UnauthenticatedError(
      "no credentials: over TCP, present a token (token_file in the ftctl context, or $FTD_TOKEN_FILE) or a "
      "client certificate; on the workstation, use ftd's unix socket");
}

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
    owner_->Register(ctx, this, who_, audited_);
  }

  void Record(const grpc::Status& st) {
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
    r.set_action(method_.substr(method_.rfind('/') + 1));
    auto [target, detail] = owner_->Described(info_->server_context(), this);
    r.set_target(target);
    r.set_detail(detail);
    r.set_code(std::string(absl::StatusCodeToString(FromGrpc(st).code())));
    if (!st.ok()) r.set_message(st.error_message().substr(0, 500));
    if (auto s = owner_->audit_->Audit(std::move(r)); !s.ok()) {
      std::cerr << "ftd: audit log: " << s.message() << std::endl;
    }
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
                        bool audited) {
  std::lock_guard<std::mutex> l(mu_);
  calls_.insert_or_assign(ctx, Call{by, std::move(who), audited, "", ""});
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

std::pair<std::string, std::string> CallAuth::Described(const grpc::ServerContextBase* ctx, const void* by) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = calls_.find(ctx);
  if (it == calls_.end() || it->second.by != by) return {};
  return {it->second.target, it->second.detail};
}

void CallAuth::Forget(const grpc::ServerContextBase* ctx, const void* by) {
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = calls_.find(ctx); it != calls_.end() && it->second.by == by) calls_.erase(it);
}

absl::StatusOr<CallLimiter::Lease> CallAuth::Admit(const grpc::ServerContextBase* ctx, const Identity& who,
                                                   bool stream) const {
  if (limits_ == nullptr || who.role() == ftd::v1::ROLE_ADMIN) return CallLimiter::Lease();
  return limits_->Admit(who.user(), ctx->peer(), stream);
}

absl::StatusOr<Identity> CallAuth::Caller(const grpc::ServerContextBase* ctx) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = calls_.find(ctx);
  if (it == calls_.end()) return absl::UnauthenticatedError("the call was not authenticated");
  return it->second.who;
}

}  // namespace ftd::server
