// dcformer-server's main program (server_main.h): flags, signals, start, serve, drain.
#include "server/server_main.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <new>
#include <system_error>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "engine/common/compute_threads.h"
#include "engine/common/flag_names.h"
#include "engine/common/logging.h"
#include "proto/rpc/grpc_log.h"
#include "server/dcformer_server.h"
#include "server/server_options.h"

namespace {

// Self-pipe: the handler only write()s (async-signal-safe); a watcher thread turns it into
// a Notification. Handlers rather than a blocked mask plus sigwait, because libraries start
// threads before main() (OpenBLAS's pool) that would otherwise take the default action.
int signal_pipe[2] = {-1, -1};

// After a signal, the process exits 1 at once when the drain has not finished within
// --drain-timeout plus this (docs/API.md "Shutdown": a normal drain ends within + 2 s).
constexpr absl::Duration kHardExitMargin = absl::Seconds(5);

void OnSignal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(signal_pipe[1], &byte, 1);
}

const char* SignalName(int sig) {
  return sig == SIGTERM  ? "SIGTERM"
         : sig == SIGINT ? "SIGINT"
         : sig == SIGHUP ? "SIGHUP"
                         : "a signal";
}

// A start that failed: exit 1 at once. Nothing was served, so there is nothing to drain, and
// an orderly shutdown of what did start (gRPC's) can wait for ever for a thread that a
// resource limit, the cause of the failure, refuses it.
[[noreturn]] void ExitFailedStart() {
  std::fflush(nullptr);
  std::_Exit(1);
}

// Runs a start-up step, turning what the system can refuse it (a thread: a pids cgroup,
// RLIMIT_NPROC, an address-space limit; memory) into an error, so that the process exits 1
// with a message instead of aborting on the exception.
template <typename Step>
absl::Status StartUpStep(Step step) {
  try {
    return step();
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(absl::StrCat("the system refused a resource: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory");
  }
}

}  // namespace

namespace dcf::server {

int ServerMain(int argc, char** argv, BackendDecorator backend_decorator) {
  // No OpenSSL atexit cleanup: it would free OpenSSL's global state under a gRPC or HTTPS
  // thread still handshaking at exit (grpc/grpc#38539; client/client_channel.cc does the same).
  OPENSSL_init_ssl(OPENSSL_INIT_NO_ATEXIT, nullptr);
  // Every gRPC core line through our logging, escaped and rate-limited (proto/rpc/grpc_log.h).
  dcf::rpc::InstallGrpcLogSink(/*print=*/true);
  std::vector<std::string> arg_storage;
  std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv,
      "serves a DCFormer model over gRPC\n  dcformer-server [--model DIR] [--port 50051] ...",
      arg_storage);
  if (rest.size() > 1) {
    std::fprintf(stderr, "dcformer-server: unexpected argument '%s'\n", rest[1]);
    return 2;
  }
  absl::StatusOr<dcf::server::ServerOptions> options = dcf::server::ServerOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "dcformer-server: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }

  // --threads and passive idle threads: the OpenMP runtime read its environment before main,
  // so this re-executes the server once with the settings in place (see compute_threads.h).
  dcf::ComputeThreadEnvironment compute;
  compute.threads = options->threads;
  if (absl::Status s = dcf::EnsureComputeThreadEnvironment(compute, argv); !s.ok()) {
    DCF_LOG(Warning) << s.message() << "; idle compute threads may spin";
  }

  // Signals are taken over only now, after the re-execution above: a SIGTERM before this
  // point has its default action (the process ends; it serves nothing yet), where a handler
  // would have written it to a pipe that exec closes. O_CLOEXEC: nothing leaks into
  // processes the server might start.
  if (pipe2(signal_pipe, O_CLOEXEC) != 0) {
    std::perror("dcformer-server: pipe");
    return 1;
  }
  struct sigaction action = {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  // SIGHUP too: its default action would end the process at once, cutting every stream (a
  // server started from a terminal gets it when the terminal closes), unless it came in
  // ignored (nohup, a supervisor): then it stays ignored.
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  struct sigaction hangup = {};
  if (sigaction(SIGHUP, nullptr, &hangup) == 0 && hangup.sa_handler != SIG_IGN) {
    sigaction(SIGHUP, &action, nullptr);
  }
  signal(SIGPIPE, SIG_IGN);

  // Static: the detached watcher below may still run while main returns.
  static absl::Notification stop;
  static std::atomic<bool> shut_down{false};  // a drain finished: the watcher stands down
  const absl::Duration hard_deadline = options->drain_timeout + kHardExitMargin;
  auto watch_signals = [hard_deadline]() {
    unsigned char sig = 0;
    while (read(signal_pipe[0], &sig, 1) != 1) {
    }
    DCF_LOG(Info) << "received " << SignalName(sig) << ": draining";
    stop.Notify();
    // A second SIGTERM or SIGINT while draining ends the process at once (not a SIGHUP: a
    // closing terminal sends two, from the shell and from the kernel); so does a shutdown that
    // overruns the drain deadline by kHardExitMargin (a model still loading, or an engine
    // step that never returns, e.g. a hung device): the orchestrator's kill would come next.
    const absl::Time give_up = absl::Now() + hard_deadline;
    bool second_signal = false;
    for (absl::Duration left = hard_deadline; left > absl::ZeroDuration() && !second_signal;
         left = give_up - absl::Now()) {
      pollfd p = {signal_pipe[0], POLLIN, 0};
      // +1: never 0 ms while time is left; the cap also covers --drain-timeout=inf.
      const int64_t ms = std::min<int64_t>(absl::ToInt64Milliseconds(left), 1 << 30) + 1;
      // EINTR (a handler ran on this thread) polls again for the time left.
      second_signal = poll(&p, 1, static_cast<int>(ms)) > 0 &&
                      read(signal_pipe[0], &sig, 1) == 1 && sig != SIGHUP;
    }
    if (shut_down.load()) return;  // the process is exiting 0 on its own
    if (second_signal) {
      DCF_LOG(Warning) << "second signal: exiting without draining";
    } else {
      DCF_LOG(Error) << "shutdown overran --drain-timeout by "
                     << absl::FormatDuration(kHardExitMargin) << ": exiting without draining";
    }
    std::_Exit(1);
  };
  const absl::Status watcher = StartUpStep([&watch_signals]() {
    std::thread(watch_signals).detach();
    return absl::OkStatus();
  });
  if (!watcher.ok()) {
    DCF_LOG(Error) << "cannot start: " << watcher.message();
    return 1;
  }

  dcf::server::DcformerServer server(*std::move(options));
  if (backend_decorator) server.SetBackendDecorator(std::move(backend_decorator));
  if (absl::Status s = StartUpStep([&server] { return server.Start(); }); !s.ok()) {
    DCF_LOG(Error) << s.message();
    ExitFailedStart();
  }
  if (!stop.HasBeenNotified()) {
    if (absl::Status s = StartUpStep([&server] { return server.LoadModel(); }); !s.ok()) {
      DCF_LOG(Error) << "cannot serve the model: " << s.message();
      ExitFailedStart();
    }
  }
  const absl::Status watched = server.Watch(&stop);
  if (!watched.ok()) DCF_LOG(Error) << watched.message();
  server.Shutdown();
  shut_down.store(true);
  return watched.ok() ? 0 : 1;
}

}  // namespace dcf::server
