// ftd.v1.AdminService: who the caller is, tokens and the audit log (proto/ftd/v1/admin.proto).
// Thin handlers over AuthStore (registered through ParsedService); everything but WhoAmI is for
// admins (server/auth/authz.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include "ftd/v1/admin.grpc.pb.h"
#include "server/auth/auth.h"
#include "server/auth/auth_store.h"
#include "server/common/clock.h"
#include "server/api/parsed_service.h"

namespace ftd::server {

class AdminServiceImpl final : public ParsedService {
 public:
  AdminServiceImpl(const CallAuth* auth, AuthStore* store, const Clock* clock);
  grpc::Status WhoAmI(grpc::ServerContext*, const ftd::v1::WhoAmIRequest*, ftd::v1::Identity*);
  grpc::Status CreateToken(grpc::ServerContext*, const ftd::v1::CreateTokenRequest*,
                           ftd::v1::CreateTokenResponse*);
  grpc::Status ListTokens(grpc::ServerContext*, const ftd::v1::ListTokensRequest*, ftd::v1::ListTokensResponse*);
  grpc::Status RevokeToken(grpc::ServerContext*, const ftd::v1::RevokeTokenRequest*, ftd::v1::Token*);
  grpc::Status ListAudit(grpc::ServerContext*, const ftd::v1::ListAuditRequest*, ftd::v1::ListAuditResponse*);

 private:
  const CallAuth* auth_;
  AuthStore* store_;
  const Clock* clock_;
};

}  // namespace ftd::server
