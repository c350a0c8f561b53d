#include "server/wire.h"

#include <vector>

#include "grpcpp/support/slice.h"

namespace dcf::server {

std::string ByteBufferToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return std::string();
  std::string out;
  out.reserve(buffer.Length());
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

void SerializeToByteBuffer(const google::protobuf::Message& message, grpc::ByteBuffer* out) {
  const std::string bytes = message.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());
  *out = grpc::ByteBuffer(&slice, 1);
}

}  // namespace dcf::server
