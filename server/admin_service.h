// ftd.v1.AdminService: who the caller is, tokens and the audit log (proto/ftd/v1/admin.proto).
// Thin handlers over AuthStore; everything but WhoAmI is for admins (server/authz.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include "ftd/v1/admin.grpc.pb.h"
#include "server/auth.h"
#include "server/auth_store.h"
#include "server/clock.h"

namespace ftd::server {

class AdminServiceImpl final : public ftd::v1::AdminService::Service {
 public:
  AdminServiceImpl(const CallAuth* auth, AuthStore* store, const Clock* clock)
      : auth_(auth), store_(store), clock_(clock) {}
  grpc::Status WhoAmI(grpc::ServerContext*, const ftd::v1::WhoAmIRequest*, ftd::v1::Identity*) override;
  grpc::Status CreateToken(grpc::ServerContext*, const ftd::v1::CreateTokenRequest*,
                           ftd::v1::CreateTokenResponse*) override;
  grpc::Status ListTokens(grpc::ServerContext*, const ftd::v1::ListTokensRequest*, ftd::v1::ListTokensResponse*) override;
  grpc::Status RevokeToken(grpc::ServerContext*, const ftd::v1::RevokeTokenRequest*, ftd::v1::Token*) override;
  grpc::Status ListAudit(grpc::ServerContext*, const ftd::v1::ListAuditRequest*, ftd::v1::ListAuditResponse*) override;

 private:
  const CallAuth* auth_;
  AuthStore* store_;
  const Clock* clock_;
};

}  // namespace ftd::server
