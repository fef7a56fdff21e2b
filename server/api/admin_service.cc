#include "server/api/admin_service.h"

#include "server/auth/authz.h"
#include "server/api/handler.h"

namespace ftd::server {

AdminServiceImpl::AdminServiceImpl(const CallAuth* auth, AuthStore* store, const Clock* clock)
    : ParsedService("ftd.v1.AdminService", Authenticated(auth)), auth_(auth), store_(store), clock_(clock) {
  Register("WhoAmI", &AdminServiceImpl::WhoAmI);
  Register("CreateToken", &AdminServiceImpl::CreateToken);
  Register("ListTokens", &AdminServiceImpl::ListTokens);
  Register("RevokeToken", &AdminServiceImpl::RevokeToken);
  Register("ListAudit", &AdminServiceImpl::ListAudit);
}

grpc::Status AdminServiceImpl::WhoAmI(grpc::ServerContext* ctx, const ftd::v1::WhoAmIRequest* req,
                                      ftd::v1::Identity* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    *resp = who;
    return grpc::Status::OK;
  });
}

grpc::Status AdminServiceImpl::CreateToken(grpc::ServerContext* ctx, const ftd::v1::CreateTokenRequest* req,
                                           ftd::v1::CreateTokenResponse* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = MayAdminister(who, "create tokens"); !st.ok()) return ToGrpc(st);
    auto r = store_->CreateToken(*req, who.user(), clock_->UnixMs());
    if (!r.ok()) return ToGrpc(r.status());
    *resp->mutable_token() = r->token;
    resp->set_secret(r->bearer);
    return grpc::Status::OK;
  });
}

grpc::Status AdminServiceImpl::ListTokens(grpc::ServerContext* ctx, const ftd::v1::ListTokensRequest* req,
                                          ftd::v1::ListTokensResponse* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = MayAdminister(who, "list tokens"); !st.ok()) return ToGrpc(st);
    auto r = store_->ListTokens(req->user(), req->include_inactive(), clock_->UnixMs());
    if (!r.ok()) return ToGrpc(r.status());
    for (auto& t : *r) *resp->add_tokens() = std::move(t);
    return grpc::Status::OK;
  });
}

grpc::Status AdminServiceImpl::RevokeToken(grpc::ServerContext* ctx, const ftd::v1::RevokeTokenRequest* req,
                                           ftd::v1::Token* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = MayAdminister(who, "revoke tokens"); !st.ok()) return ToGrpc(st);
    if (req->id().empty()) return ToGrpc(absl::InvalidArgumentError("id is required (ftctl admin token list shows them)"));
    auto r = store_->RevokeToken(req->id(), clock_->UnixMs());
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

grpc::Status AdminServiceImpl::ListAudit(grpc::ServerContext* ctx, const ftd::v1::ListAuditRequest* req,
                                         ftd::v1::ListAuditResponse* resp) {
  return Authed(auth_, ctx, req, resp, [&](const Identity& who) {
    if (auto st = MayAdminister(who, "read the audit log"); !st.ok()) return ToGrpc(st);
    auto r = store_->ListAudit(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  });
}

}  // namespace ftd::server
