// Bytes <-> gRPC ByteBuffer for the service's raw methods (see request_parser.h for why the
// service parses and serializes its messages itself).
#pragma once

#include <string>

#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace dcf::server {

// The buffer's bytes, concatenated (empty when it cannot be read).
std::string ByteBufferToString(const grpc::ByteBuffer& buffer);

// Serializes `message` into `out` (replacing its contents). Runs on the calling thread: the
// write that follows does no serialization of its own.
void SerializeToByteBuffer(const google::protobuf::Message& message, grpc::ByteBuffer* out);

}  // namespace dcf::server
