// The coordinator in one process: a server on a loopback port and several clients (one per
// rank, on threads). Covers rendezvous, barriers, heartbeats and the watchdog's hung
// verdict, abort delivery, and the refusal of bad requests (after which it keeps serving).
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "comm/clock.h"
#include "comm/coordinator.grpc.pb.h"
#include "comm/coordinator_client.h"
#include "comm/coordinator_server.h"
#include "comm/job_token.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

#define EXPECT_CODE(expr, code_)                                  \
  do {                                                            \
    const absl::Status tandem_s_ = (expr);                        \
    EXPECT_EQ(tandem_s_.code(), absl::StatusCode::code_) << tandem_s_; \
  } while (0)

// Collects everything the server logs.
struct LogSink {
  absl::Mutex mu;
  std::string text ABSL_GUARDED_BY(mu);
  std::function<void(const std::string&)> Fn() {
    return [this](const std::string& s) {
      absl::MutexLock lock(&mu);
      text += s;
    };
  }
  std::string Get() {
    absl::MutexLock lock(&mu);
    return text;
  }
};

class CoordinatorTest : public ::testing::Test {
 protected:
  void StartServer(int world, CoordinatorServerOptions o = {}) {
    o.world_size = world;
    o.token = kToken;
    o.job_config = "model=gpt2-tiny strategy=data";
    o.log = log_.Fn();
    auto s = CoordinatorServer::Start(std::move(o));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    world_ = world;
  }

  // A server whose heartbeat ages are measured on `clock`; the test runs the watchdog by hand
  // (CheckHeartbeats).
  void StartServerOnClock(int world, ManualClock* clock, CoordinatorServerOptions o = {}) {
    o.clock = clock;
    o.heartbeat_timeout = absl::Seconds(10);
    o.watchdog_interval = absl::Hours(1);
    StartServer(world, std::move(o));
  }

  CoordinatorClientOptions ClientOptions(int rank, std::string token = kToken) {
    CoordinatorClientOptions o;
    o.address = server_->address();
    o.token = std::move(token);
    o.rank = rank;
    o.rpc_timeout = absl::Seconds(5);
    o.heartbeat_interval = absl::Milliseconds(100);
    return o;
  }

  std::unique_ptr<CoordinatorClient> Client(int rank, std::string token = kToken) {
    auto c = CoordinatorClient::Connect(ClientOptions(rank, std::move(token)));
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(*c);
  }

  WorkerIdentity Identity(int rank) {
    WorkerIdentity id;
    id.world_size = world_;
    id.host = "worker-host";
    id.pid = 1000 + rank;
    id.device = "cpu";
    return id;
  }

  std::vector<std::unique_ptr<CoordinatorClient>> RegisterAll() {
    std::vector<std::unique_ptr<CoordinatorClient>> clients;
    for (int r = 0; r < world_; ++r) {
      clients.push_back(Client(r));
      auto job = clients.back()->Register(Identity(r), absl::Seconds(10));
      EXPECT_TRUE(job.ok()) << job.status();
    }
    return clients;
  }

  // A registered client whose heartbeats, every 50 ms, count as an abort after failing for
  // 300 ms.
  std::unique_ptr<CoordinatorClient> ImpatientClient(int rank) {
    auto o = ClientOptions(rank);
    o.coordinator_timeout = absl::Milliseconds(300);
    o.heartbeat_interval = absl::Milliseconds(50);
    auto c = CoordinatorClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    auto job = (*c)->Register(Identity(rank), absl::Seconds(5));
    EXPECT_TRUE(job.ok()) << job.status();
    return std::move(*c);
  }

  // The server still answers a well-formed request.
  void ExpectStillServing() {
    auto c = Client(-1);
    auto status = c->GetStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->world_size(), world_);
  }

  LogSink log_;
  std::unique_ptr<CoordinatorServer> server_;
  int world_ = 1;
};

TEST(JobTokenTest, RandomHexAndConstantTimeCompare) {
  auto a = GenerateJobToken();
  auto b = GenerateJobToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(*a, *b);
  EXPECT_TRUE(TokensEqual(*a, *a));
  EXPECT_FALSE(TokensEqual(*a, *b));
  EXPECT_FALSE(TokensEqual(*a, a->substr(0, 63)));
  EXPECT_FALSE(TokensEqual("", *a));
}

TEST(CoordinatorStartTest, RefusesRemoteListeningUnlessAllowedAndWeakTokens) {
  CoordinatorServerOptions o;
  o.token = kToken;
  o.address = "0.0.0.0:0";
  auto remote = CoordinatorServer::Start(o);
  EXPECT_CODE(remote.status(), kInvalidArgument);
  EXPECT_THAT(std::string(remote.status().message()), HasSubstr("other hosts could reach it"));
  o.address = "127.0.0.1:0";
  o.token = "short";
  EXPECT_CODE(CoordinatorServer::Start(o).status(), kInvalidArgument);
  o.token = kToken;
  o.world_size = 0;
  EXPECT_CODE(CoordinatorServer::Start(o).status(), kInvalidArgument);
  o.world_size = 2;
  o.address = "0.0.0.0:0";
  o.allow_remote = true;
  auto allowed = CoordinatorServer::Start(o);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_GT((*allowed)->port(), 0);
}

TEST(CoordinatorClientOptionsTest, FromEnvironmentNamesTheMissingVariable) {
  unsetenv(kCoordinatorAddressEnv);
  unsetenv(kJobTokenEnv);
  auto none = CoordinatorClientOptions::FromEnvironment(0);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr(kCoordinatorAddressEnv));
  setenv(kCoordinatorAddressEnv, "127.0.0.1:1234", 1);
  auto no_token = CoordinatorClientOptions::FromEnvironment(0);
  EXPECT_THAT(std::string(no_token.status().message()), HasSubstr(kJobTokenEnv));
  setenv(kJobTokenEnv, kToken, 1);
  auto ok = CoordinatorClientOptions::FromEnvironment(3);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->address, "127.0.0.1:1234");
  EXPECT_EQ(ok->token, kToken);
  EXPECT_EQ(ok->rank, 3);
  unsetenv(kCoordinatorAddressEnv);
  unsetenv(kJobTokenEnv);
}

TEST_F(CoordinatorTest, RendezvousOfNClients) {
  StartServer(4);
  // A NCCL-style unique id: 128 arbitrary bytes, zeros included.
  std::string id(128, '\0');
  for (int i = 0; i < 128; ++i) id[i] = static_cast<char>((i * 37) & 0xff);
  std::vector<std::string> got(4);
  std::vector<absl::Status> errors(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] {
      auto c = Client(r);
      auto job = c->Register(Identity(r), absl::Seconds(10));
      if (!job.ok()) {
        errors[r] = job.status();
        return;
      }
      if (job->job_config != "model=gpt2-tiny strategy=data" || job->world_size != 4) {
        errors[r] = absl::InternalError("wrong job info");
        return;
      }
      if (r == 0) {
        errors[r] = c->Set("nccl/unique_id", id);
        if (!errors[r].ok()) return;
      }
      auto v = c->Wait("nccl/unique_id", absl::Seconds(10));
      if (!v.ok()) {
        errors[r] = v.status();
        return;
      }
      got[r] = *v;
      errors[r] = c->Barrier("init", absl::Seconds(10));
      if (errors[r].ok()) errors[r] = c->Barrier("init", absl::Seconds(10));  // reusable
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(errors[r].ok()) << "rank " << r << ": " << errors[r];
    EXPECT_EQ(got[r], id) << "rank " << r;
  }
  auto c = Client(0);
  auto v = c->Get("nccl/unique_id");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, id);
  EXPECT_CODE(c->Get("no/such/key").status(), kNotFound);
  auto status = c->GetStatus();
  ASSERT_TRUE(status.ok());
  for (const auto& r : status->ranks()) EXPECT_TRUE(r.registered()) << r.rank();
}

TEST_F(CoordinatorTest, KeyWaitTimeoutNamesRankAndKey) {
  StartServer(2);
  auto c = Client(1);
  const absl::Time start = absl::Now();
  auto v = c->Wait("nccl/unique_id", absl::Milliseconds(200));
  EXPECT_CODE(v.status(), kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  const std::string m(v.status().message());
  EXPECT_THAT(m, HasSubstr("rank 1: KeyWait('nccl/unique_id')"));
  EXPECT_THAT(m, HasSubstr("timed out after 200ms"));
  EXPECT_THAT(m, HasSubstr("waited for key 'nccl/unique_id' to be set"));
}

TEST_F(CoordinatorTest, BarrierTimeoutNamesTheMissingRank) {
  StartServer(3);
  auto clients = RegisterAll();
  absl::Status s1;
  std::thread t([&] { s1 = clients[1]->Barrier("step-7", absl::Seconds(2)); });
  absl::SleepFor(absl::Milliseconds(300));  // rank 1 is waiting
  absl::Status s0 = clients[0]->Barrier("step-7", absl::Milliseconds(300));
  EXPECT_CODE(s0, kDeadlineExceeded);
  EXPECT_THAT(std::string(s0.message()), HasSubstr("rank 0: Barrier('step-7')"));
  EXPECT_THAT(std::string(s0.message()), HasSubstr("2 of 3 ranks arrived; missing rank 2"));
  t.join();
  EXPECT_CODE(s1, kDeadlineExceeded);
  // All three arrive: the same name works after the timeouts.
  std::vector<std::thread> threads;
  std::vector<absl::Status> s(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] { s[r] = clients[r]->Barrier("step-7", absl::Seconds(10)); });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(s[r].ok()) << s[r];
}

TEST_F(CoordinatorTest, HeartbeatLossNamesTheSilentRankAndAbortsEveryone) {
  ManualClock clock;
  StartServerOnClock(3, &clock);
  auto clients = RegisterAll();
  WorkerReport in_collective;
  in_collective.step = 17;
  in_collective.phase = "all_reduce";
  in_collective.collective_issued = 42;
  in_collective.collective_completed = 41;
  WorkerReport computing = in_collective;
  computing.phase = "backward";
  computing.collective_issued = 41;
  ASSERT_TRUE(clients[0]->Heartbeat(in_collective).ok());
  ASSERT_TRUE(clients[1]->Heartbeat(in_collective).ok());
  ASSERT_TRUE(clients[2]->Heartbeat(computing).ok());
  clock.Advance(absl::Seconds(6));
  ASSERT_TRUE(clients[0]->Heartbeat(in_collective).ok());
  ASSERT_TRUE(clients[1]->Heartbeat(in_collective).ok());
  server_->CheckHeartbeats();
  EXPECT_FALSE(server_->aborted());  // rank 2 silent for 6 s: not yet
  clock.Advance(absl::Seconds(6));
  ASSERT_TRUE(clients[0]->Heartbeat(in_collective).ok());
  ASSERT_TRUE(clients[1]->Heartbeat(in_collective).ok());
  server_->CheckHeartbeats();
  ASSERT_TRUE(server_->aborted());
  const std::string reason = server_->abort_reason();
  // The watchdog is the launcher's, in whose process the coordinator runs.
  EXPECT_THAT(reason, StartsWith("the launcher aborted the job: watchdog: rank 2 hung: no "
                                 "heartbeat for 12s"));
  EXPECT_THAT(reason, HasSubstr("step 17, phase 'backward', collective #41 issued"));
  EXPECT_THAT(reason,
              HasSubstr("collective #42: entered by ranks 0, 1; never entered by rank 2"));
  // The printed report: every rank's last report, the silent one marked.
  const std::string report = log_.Get();
  std::printf("%s", report.c_str());  // what an operator would see
  EXPECT_THAT(report,
              HasSubstr("coordinator: the launcher aborted the job: watchdog: rank 2 hung"));
  EXPECT_THAT(report, HasSubstr("all_reduce"));
  EXPECT_THAT(report, HasSubstr("backward"));
  EXPECT_THAT(report, HasSubstr("12.0s ago  <-- silent"));
  EXPECT_EQ(report.find("0.0s ago  <-- silent"), std::string::npos) << report;
  // Every client learns it at its next heartbeat.
  for (int r = 0; r < 3; ++r) {
    auto state = clients[r]->Heartbeat(in_collective);
    ASSERT_TRUE(state.ok()) << state.status();
    EXPECT_TRUE(state->aborted);
    EXPECT_EQ(state->reason, reason);
    EXPECT_TRUE(clients[r]->aborted());
  }
  ExpectStillServing();
}

TEST_F(CoordinatorTest, FinishedRanksAreNotDeclaredHung) {
  ManualClock clock;
  StartServerOnClock(2, &clock);
  auto clients = RegisterAll();
  WorkerReport done;
  done.finished = true;
  ASSERT_TRUE(clients[0]->Heartbeat(done).ok());
  ASSERT_TRUE(clients[1]->Heartbeat(done).ok());
  clock.Advance(absl::Minutes(5));
  server_->CheckHeartbeats();
  EXPECT_FALSE(server_->aborted()) << server_->abort_reason();
}

TEST_F(CoordinatorTest, TheDeviceAWorkerLearnsAfterRegistrationReachesTheStatus) {
  StartServer(2);
  auto clients = RegisterAll();  // registered with device "cpu"
  WorkerReport r;
  r.device = "cuda:1";
  ASSERT_TRUE(clients[1]->Heartbeat(r).ok());
  r.device = "";  // a report without one keeps the last
  ASSERT_TRUE(clients[1]->Heartbeat(r).ok());
  const rpc::GetStatusResponse st = server_->Status();
  ASSERT_EQ(st.ranks_size(), 2);
  EXPECT_EQ(st.ranks(0).device(), "cpu");
  EXPECT_EQ(st.ranks(1).device(), "cuda:1");
}

TEST_F(CoordinatorTest, UnregisteredRanksAbortAfterTheRegistrationTimeout) {
  ManualClock clock;
  CoordinatorServerOptions o;
  o.registration_timeout = absl::Seconds(60);
  StartServerOnClock(4, &clock, o);
  auto c0 = Client(0);
  ASSERT_TRUE(c0->Register(Identity(0), absl::Seconds(5)).ok());
  auto c2 = Client(2);
  ASSERT_TRUE(c2->Register(Identity(2), absl::Seconds(5)).ok());
  clock.Advance(absl::Seconds(30));
  ASSERT_TRUE(c0->Heartbeat({}).ok());
  ASSERT_TRUE(c2->Heartbeat({}).ok());
  server_->CheckHeartbeats();
  EXPECT_FALSE(server_->aborted());
  clock.Advance(absl::Seconds(31));
  ASSERT_TRUE(c0->Heartbeat({}).ok());
  ASSERT_TRUE(c2->Heartbeat({}).ok());
  server_->CheckHeartbeats();
  EXPECT_EQ(server_->abort_reason(),
            "the launcher aborted the job: watchdog: ranks 1, 3 never registered within 1m");
  EXPECT_THAT(log_.Get(), HasSubstr("never registered  <-- missing"));
}

TEST_F(CoordinatorTest, WatchdogWithRealHeartbeatThreads) {
  CoordinatorServerOptions o;
  o.heartbeat_timeout = absl::Milliseconds(1500);
  o.watchdog_interval = absl::Milliseconds(50);
  StartServer(3, o);
  auto clients = RegisterAll();
  absl::Mutex mu;
  std::vector<std::string> reasons(3);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(clients[r]
                    ->StartHeartbeats(
                        [r] {
                          WorkerReport w;
                          w.step = 3;
                          w.phase = r == 2 ? "forward" : "all_reduce";
                          w.collective_issued = r == 2 ? 8 : 9;
                          w.collective_completed = 8;
                          return w;
                        },
                        [&, r](const std::string& reason) {
                          absl::MutexLock lock(&mu);
                          reasons[r] = reason;
                        })
                    .ok());
  }
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(clients[2]->StopHeartbeats(false).ok());  // rank 2 hangs
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto delivered = [&] {
    absl::MutexLock lock(&mu);
    return !reasons[0].empty() && !reasons[1].empty();
  };
  while (!delivered() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(delivered());
  absl::MutexLock lock(&mu);
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(reasons[r], HasSubstr("watchdog: rank 2 hung")) << r;
    EXPECT_THAT(reasons[r], HasSubstr("collective #9: entered by ranks 0, 1; never entered by "
                                      "rank 2"));
  }
  EXPECT_TRUE(reasons[2].empty());
}

TEST_F(CoordinatorTest, AbortReachesEveryClientWithinOneHeartbeatInterval) {
  StartServer(4);
  const absl::Duration interval = absl::Milliseconds(300);
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int r = 0; r < 4; ++r) {
    auto o = ClientOptions(r);
    o.heartbeat_interval = interval;
    clients.push_back(CoordinatorClient::Connect(o).value());
    ASSERT_TRUE(clients.back()->Register(Identity(r), absl::Seconds(10)).ok());
  }
  absl::Mutex mu;
  std::vector<absl::Time> when(4, absl::InfiniteFuture());
  std::vector<std::string> reasons(4);
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(clients[r]
                    ->StartHeartbeats([] { return WorkerReport{}; },
                                      [&, r](const std::string& reason) {
                                        absl::MutexLock lock(&mu);
                                        when[r] = absl::Now();
                                        reasons[r] = reason;
                                      })
                    .ok());
  }
  // Rank 3 waits for a key that never comes; the abort must end the wait too.
  absl::Status waited;
  std::thread waiter([&] { waited = clients[3]->Wait("never/set", absl::Seconds(30)).status(); });
  absl::SleepFor(absl::Milliseconds(250));
  const absl::Time aborted_at = absl::Now();
  ASSERT_TRUE(clients[1]->Abort("loss is nan at step 12").ok());
  waiter.join();
  EXPECT_CODE(waited, kAborted);
  EXPECT_THAT(std::string(waited.message()), HasSubstr("rank 1 aborted the job: loss is nan"));
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  for (;;) {
    {
      absl::MutexLock lock(&mu);
      bool all = true;
      for (int r = 0; r < 4; ++r) all = all && when[r] != absl::InfiniteFuture();
      if (all || absl::Now() > deadline) break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::MutexLock lock(&mu);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(reasons[r], "rank 1 aborted the job: loss is nan at step 12") << r;
    // One interval, plus an allowance for the RPC on a loaded machine.
    EXPECT_LE(when[r] - aborted_at, interval + absl::Milliseconds(300)) << "rank " << r;
  }
  EXPECT_THAT(log_.Get(), HasSubstr("coordinator: rank 1 aborted the job: loss is nan"));
  // Late registration is refused; the server still answers.
  auto late = Client(0)->Register(Identity(0), absl::Seconds(2));
  EXPECT_FALSE(late.ok());
  ExpectStillServing();
}

TEST_F(CoordinatorTest, LauncherAbortReachesClients) {
  StartServer(2);
  auto clients = RegisterAll();
  server_->Abort("interrupted (SIGINT)");
  for (auto& c : clients) {
    auto s = c->Heartbeat({});
    ASSERT_TRUE(s.ok());
    EXPECT_TRUE(s->aborted);
    EXPECT_EQ(s->reason, "the launcher aborted the job: interrupted (SIGINT)");
  }
  // The first abort stands: a later one, a worker's or the launcher's, changes nothing.
  ASSERT_TRUE(clients[0]->Abort("bad data").ok());
  server_->Abort("a second SIGTERM");
  EXPECT_EQ(server_->abort_reason(), "the launcher aborted the job: interrupted (SIGINT)");
}

TEST_F(CoordinatorTest, TheOwnerNamedInAbortsIsWhoeverRunsTheCoordinator) {
  // Under Slurm, rank 0 runs it; its watchdog's aborts say so.
  ManualClock clock;
  CoordinatorServerOptions o;
  o.owner = "the coordinator in rank 0";
  StartServerOnClock(2, &clock, o);
  auto clients = RegisterAll();
  ASSERT_TRUE(clients[0]->Heartbeat({}).ok());
  clock.Advance(absl::Seconds(11));
  ASSERT_TRUE(clients[0]->Heartbeat({}).ok());
  server_->CheckHeartbeats();
  EXPECT_THAT(server_->abort_reason(),
              StartsWith("the coordinator in rank 0 aborted the job: watchdog: rank 1 hung"));
  o.token = kToken;
  o.owner = "";
  const absl::Status unnamed = CoordinatorServer::Start(o).status();
  EXPECT_CODE(unnamed, kInvalidArgument);
  EXPECT_THAT(std::string(unnamed.message()), HasSubstr("the owner, who aborts the job"));
}

TEST_F(CoordinatorTest, NoRequestCanSpeakForTheLauncher) {
  StartServer(2);
  auto clients = RegisterAll();
  // The launcher aborts in its own process; over RPC, rank -1 is refused like any rank
  // outside the job.
  auto impostor = Client(-1);
  const absl::Status abort = impostor->Abort("pretending to be the launcher");
  EXPECT_CODE(abort, kInvalidArgument);
  EXPECT_THAT(std::string(abort.message()),
              HasSubstr("Abort: rank -1 is outside 0..1 (requests come from workers; the "
                        "launcher is not a caller)"));
  for (int rank : {-2, 2, 1 << 30}) {
    const absl::Status s = Client(rank)->Abort("no such rank");
    EXPECT_CODE(s, kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("Abort: rank ", rank,
                                                                 " is outside 0..1")));
  }
  EXPECT_CODE(impostor->Set("k", "v"), kInvalidArgument);
  EXPECT_CODE(impostor->Get("k").status(), kInvalidArgument);
  EXPECT_CODE(impostor->Wait("k", absl::Seconds(1)).status(), kInvalidArgument);
  EXPECT_FALSE(server_->aborted()) << server_->abort_reason();
  for (auto& c : clients) {
    auto s = c->Heartbeat({});
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_FALSE(s->aborted);
  }
  // A worker's abort names the worker.
  ASSERT_TRUE(clients[1]->Abort("out of memory").ok());
  EXPECT_EQ(server_->abort_reason(), "rank 1 aborted the job: out of memory");
  ExpectStillServing();
}

TEST_F(CoordinatorTest, StopRequestReachesClientsWithoutAborting) {
  LogSink events;
  CoordinatorServerOptions o;
  o.events = events.Fn();
  StartServer(2, o);
  auto clients = RegisterAll();
  for (auto& c : clients) {
    auto s = c->Heartbeat({});
    ASSERT_TRUE(s.ok());
    EXPECT_FALSE(s->stop_requested);
    EXPECT_FALSE(c->stop_requested());
  }
  server_->RequestStop();
  EXPECT_TRUE(server_->stop_requested());
  for (auto& c : clients) {
    auto s = c->Heartbeat({});
    ASSERT_TRUE(s.ok());
    EXPECT_TRUE(s->stop_requested);
    EXPECT_FALSE(s->aborted);
    EXPECT_TRUE(c->stop_requested());
    EXPECT_FALSE(c->aborted());
  }
  EXPECT_FALSE(server_->aborted());
  // Every registration is recorded with the address it came from.
  const std::string text = events.Get();
  EXPECT_THAT(text, HasSubstr("rank 0 registered from ipv4:127.0.0.1:"));
  EXPECT_THAT(text, HasSubstr("rank 1 registered from ipv4:127.0.0.1:"));
  const rpc::GetStatusResponse st = server_->Status();
  EXPECT_TRUE(absl::StartsWith(st.ranks(1).peer(), "ipv4:127.0.0.1:")) << st.ranks(1).peer();
}

TEST_F(CoordinatorTest, WrongOrMissingTokenIsRefused) {
  StartServer(2);
  auto bad = Client(0, "fedcba9876543210fedcba9876543210");
  auto reg = bad->Register(Identity(0), absl::Seconds(5));
  EXPECT_CODE(reg.status(), kUnauthenticated);
  EXPECT_THAT(std::string(reg.status().message()), HasSubstr("wrong job token"));
  EXPECT_EQ(std::string(reg.status().message()).find("fedcba98"), std::string::npos)
      << "a token must never appear in messages";
  EXPECT_CODE(bad->Set("k", "v"), kUnauthenticated);
  EXPECT_CODE(bad->Get("k").status(), kUnauthenticated);
  EXPECT_CODE(bad->Wait("k", absl::Seconds(1)).status(), kUnauthenticated);
  EXPECT_CODE(bad->Barrier("b", absl::Seconds(1)), kUnauthenticated);
  EXPECT_CODE(bad->Heartbeat({}).status(), kUnauthenticated);
  EXPECT_CODE(bad->Abort("sabotage"), kUnauthenticated);
  EXPECT_CODE(bad->GetStatus().status(), kUnauthenticated);
  EXPECT_FALSE(server_->aborted());
  // No token at all: a raw stub.
  auto stub = rpc::Coordinator::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  rpc::GetStatusRequest req;
  rpc::GetStatusResponse resp;
  grpc::Status s = stub->GetStatus(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(s.error_message(), HasSubstr("without the job token"));
  ExpectStillServing();
}

TEST_F(CoordinatorTest, DuplicateAndOutOfRangeRanksAreRefused) {
  StartServer(2);
  ASSERT_TRUE(Client(1)->Register(Identity(1), absl::Seconds(5)).ok());
  auto dup = Client(1)->Register(Identity(1), absl::Seconds(5));
  EXPECT_CODE(dup.status(), kAlreadyExists);
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("rank 1 is already registered"));
  auto high = Client(2)->Register(Identity(2), absl::Seconds(5));
  EXPECT_CODE(high.status(), kInvalidArgument);
  EXPECT_THAT(std::string(high.status().message()), HasSubstr("rank 2 is outside 0..1"));
  EXPECT_CODE(Client(-1)->Register(Identity(0), absl::Seconds(5)).status(), kInvalidArgument);
  EXPECT_CODE(Client(-7)->Set("k", "v"), kInvalidArgument);
  EXPECT_CODE(Client(2)->Heartbeat({}).status(), kInvalidArgument);
  EXPECT_CODE(Client(-1)->Barrier("b", absl::Seconds(1)), kInvalidArgument);
  WorkerIdentity wrong_world = Identity(0);
  wrong_world.world_size = 8;
  auto ww = Client(0)->Register(wrong_world, absl::Seconds(5));
  EXPECT_CODE(ww.status(), kInvalidArgument);
  EXPECT_THAT(std::string(ww.status().message()), HasSubstr("believes the world size is 8"));
  // Heartbeat before registering.
  EXPECT_CODE(Client(0)->Heartbeat({}).status(), kFailedPrecondition);
  // Rank 0 can still register after all that.
  EXPECT_TRUE(Client(0)->Register(Identity(0), absl::Seconds(5)).ok());
  ExpectStillServing();
}

TEST_F(CoordinatorTest, MalformedFieldsAreRefusedAndTheServerKeepsServing) {
  StartServer(2);
  auto clients = RegisterAll();
  auto& c = clients[0];
  // Values: the limit is accepted, one byte more is not, far more is cut off by gRPC.
  EXPECT_TRUE(c->Set("big", std::string(kMaxValueBytes, 'x')).ok());
  absl::Status over = c->Set("big", std::string(kMaxValueBytes + 1, 'x'));
  EXPECT_CODE(over, kInvalidArgument);
  EXPECT_THAT(std::string(over.message()), HasSubstr("1048577 bytes, more than the 1048576"));
  EXPECT_CODE(c->Set("huge", std::string(3 << 20, 'x')), kResourceExhausted);
  auto kept = c->Get("big");
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size(), kMaxValueBytes);
  // Keys and names.
  EXPECT_CODE(c->Set("", "v"), kInvalidArgument);
  EXPECT_CODE(c->Set(std::string(kMaxKeyBytes + 1, 'k'), "v"), kInvalidArgument);
  EXPECT_TRUE(c->Set(std::string(kMaxKeyBytes, 'k'), "v").ok());
  EXPECT_CODE(c->Set("a key with spaces", "v"), kInvalidArgument);
  EXPECT_CODE(c->Set("tab\tkey", "v"), kInvalidArgument);
  EXPECT_CODE(c->Get("../etc/passwd\n").status(), kInvalidArgument);
  EXPECT_CODE(c->Barrier("bad name!", absl::Seconds(1)), kInvalidArgument);
  EXPECT_CODE(c->Wait("k", absl::Milliseconds(-5)).status(), kInvalidArgument);
  // Reports.
  WorkerReport bad_phase;
  bad_phase.phase = "forward\x1b[2J";
  EXPECT_CODE(c->Heartbeat(bad_phase).status(), kInvalidArgument);
  WorkerReport long_phase;
  long_phase.phase = std::string(kMaxTextBytes + 1, 'p');
  EXPECT_CODE(c->Heartbeat(long_phase).status(), kInvalidArgument);
  WorkerReport negative;
  negative.step = -1;
  EXPECT_CODE(c->Heartbeat(negative).status(), kInvalidArgument);
  WorkerReport ahead;
  ahead.collective_issued = 3;
  ahead.collective_completed = 4;
  EXPECT_CODE(c->Heartbeat(ahead).status(), kInvalidArgument);
  EXPECT_CODE(c->Abort(""), kInvalidArgument);
  EXPECT_CODE(c->Abort(std::string(kMaxReasonBytes + 1, 'r')), kInvalidArgument);
  WorkerIdentity no_host = Identity(1);
  no_host.host = "";
  EXPECT_CODE(Client(1)->Register(no_host, absl::Seconds(5)).status(), kInvalidArgument);
  WorkerIdentity bad_pid = Identity(1);
  bad_pid.pid = 0;
  EXPECT_CODE(Client(1)->Register(bad_pid, absl::Seconds(5)).status(), kInvalidArgument);
  EXPECT_FALSE(server_->aborted());
  // A raw request gRPC cannot parse as a string field (invalid UTF-8) is refused too.
  auto stub = rpc::Coordinator::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata(kTokenMetadataKey, kToken);
  rpc::KeyGetRequest req;
  req.set_rank(0);
  req.set_key(std::string("\xff\xfe", 2));
  rpc::KeyGetResponse resp;
  EXPECT_FALSE(stub->KeyGet(&ctx, req, &resp).ok());
  // Everything still works.
  EXPECT_TRUE(c->Set("after", "ok").ok());
  auto after = clients[1]->Get("after");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, "ok");
  EXPECT_TRUE(c->Heartbeat({}).ok());
  ExpectStillServing();
}

// Each report a worker cannot have measured, with what its refusal must name.
struct BadReport {
  std::function<void(WorkerReport*)> spoil;
  std::string message;
};

std::vector<BadReport> BadReports() {
  return {
      {[](WorkerReport* w) { w->step = -1; }, "Heartbeat: rank 1: step -1 < 0"},
      {[](WorkerReport* w) { w->step_time_ms = -3; },
       "Heartbeat: rank 1: step_time_ms -3 is not a finite time >= 0"},
      {[](WorkerReport* w) { w->step_time_ms = std::nan(""); },
       "Heartbeat: rank 1: step_time_ms nan is not a finite time >= 0"},
      {[](WorkerReport* w) { w->step_time_ms = HUGE_VAL; },
       "Heartbeat: rank 1: step_time_ms inf is not a finite time >= 0"},
      {[](WorkerReport* w) { w->memory_allocated_bytes = -1; },
       "Heartbeat: rank 1: memory_allocated_bytes -1 < 0"},
      {[](WorkerReport* w) { w->memory_peak_bytes = -4096; },
       "Heartbeat: rank 1: memory_peak_bytes -4096 < 0"},
      {[](WorkerReport* w) { w->memory_allocated_bytes = w->memory_peak_bytes + 1; },
       "Heartbeat: rank 1: memory_allocated_bytes 1048577 is more than memory_peak_bytes "
       "1048576"},
      {[](WorkerReport* w) { w->collective_issued = static_cast<uint64_t>(int64_t{-1}); },
       "Heartbeat: rank 1: collective_issued 18446744073709551615 is more than "
       "9223372036854775807"},
      {[](WorkerReport* w) {
         w->collective_issued = uint64_t{1} << 63;
         w->collective_completed = uint64_t{1} << 63;
       },
       "Heartbeat: rank 1: collective_issued 9223372036854775808 is more than"},
      {[](WorkerReport* w) { w->collective_completed = w->collective_issued + 1; },
       "Heartbeat: rank 1: collective #43 completed but only #42 issued"},
      {[](WorkerReport* w) { w->phase = "train\x1b[2J"; },
       "Heartbeat: rank 1: phase has a non-printable character"},
      {[](WorkerReport* w) { w->device = std::string(kMaxTextBytes + 1, 'd'); },
       "Heartbeat: rank 1: device is 257 bytes, more than the 256 allowed"},
  };
}

TEST_F(CoordinatorTest, ImpossibleMetricsAreRefusedAndTheRankTrainsOn) {
  StartServer(2);
  auto clients = RegisterAll();
  WorkerReport good;
  good.step = 7;
  good.phase = "train";
  good.collective_issued = 42;
  good.collective_completed = 41;
  good.loss = 3.25;
  good.step_time_ms = 12.5;
  good.memory_allocated_bytes = 1 << 19;
  good.memory_peak_bytes = 1 << 20;
  ASSERT_TRUE(clients[1]->Heartbeat(good).ok());
  for (const BadReport& bad : BadReports()) {
    WorkerReport w = good;
    bad.spoil(&w);
    const absl::Status s = clients[1]->Heartbeat(w).status();
    EXPECT_CODE(s, kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(bad.message));
    // Nothing of a refused report is stored.
    const rpc::RankStatus st = server_->Status().ranks(1);
    EXPECT_EQ(st.step(), 7) << bad.message;
    EXPECT_EQ(st.phase(), "train");
    EXPECT_EQ(st.collective_issued(), 42u);
    EXPECT_EQ(st.metrics().step_time_ms(), 12.5);
    EXPECT_EQ(st.metrics().memory_peak_bytes(), 1 << 20);
  }
  EXPECT_FALSE(server_->aborted()) << server_->abort_reason();
  // The loss may be anything: a skipped f16 step's is inf or nan, and training goes on.
  for (double loss : {HUGE_VAL, -HUGE_VAL, std::nan(""), -1.0}) {
    WorkerReport w = good;
    w.loss = loss;
    EXPECT_TRUE(clients[1]->Heartbeat(w).ok()) << loss;
  }
  // The rank's next good report is taken.
  good.step = 8;
  good.collective_issued = good.collective_completed = 44;
  good.memory_allocated_bytes = good.memory_peak_bytes;
  ASSERT_TRUE(clients[1]->Heartbeat(good).ok());
  const rpc::RankStatus st = server_->Status().ranks(1);
  EXPECT_EQ(st.step(), 8);
  EXPECT_EQ(st.collective_completed(), 44u);
  EXPECT_EQ(st.metrics().memory_allocated_bytes(), 1 << 20);
  EXPECT_TRUE(clients[0]->Heartbeat({}).ok());
  EXPECT_FALSE(server_->aborted()) << server_->abort_reason();
  ExpectStillServing();
}

TEST_F(CoordinatorTest, ARankWhoseHeartbeatsAreRefusedIsHungAndTheVerdictSaysWhy) {
  ManualClock clock;
  StartServerOnClock(2, &clock);
  auto clients = RegisterAll();
  WorkerReport good;
  good.step = 3;
  ASSERT_TRUE(clients[0]->Heartbeat(good).ok());
  ASSERT_TRUE(clients[1]->Heartbeat(good).ok());
  WorkerReport bad = good;
  bad.step_time_ms = std::nan("");
  for (int i = 0; i < 2; ++i) {  // rank 1 keeps sending, and nothing it sends is taken
    clock.Advance(absl::Seconds(6));
    ASSERT_TRUE(clients[0]->Heartbeat(good).ok());
    EXPECT_CODE(clients[1]->Heartbeat(bad).status(), kInvalidArgument);
  }
  server_->CheckHeartbeats();
  ASSERT_TRUE(server_->aborted());
  EXPECT_THAT(server_->abort_reason(),
              HasSubstr("the launcher aborted the job: watchdog: rank 1 hung: no heartbeat for "
                        "12s"));
  EXPECT_THAT(server_->abort_reason(),
              HasSubstr("its last heartbeat was refused: Heartbeat: rank 1: step_time_ms nan is "
                        "not a finite time >= 0"));
}

TEST_F(CoordinatorTest, AWorkerWhoseHeartbeatsAreAllRefusedSaysSo) {
  StartServer(1);
  auto c = ImpatientClient(0);
  absl::Notification refused;
  std::string reason;
  ASSERT_TRUE(c->StartHeartbeats(
                      [] {
                        WorkerReport w;
                        w.memory_peak_bytes = -1;
                        return w;
                      },
                      [&](const std::string& r) {
                        reason = r;
                        refused.Notify();
                      })
                  .ok());
  ASSERT_TRUE(refused.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_THAT(reason, HasSubstr("rank 0 was refused by the coordinator at "));
  EXPECT_THAT(reason, HasSubstr("no heartbeat accepted for 300ms"));
  EXPECT_THAT(reason, HasSubstr("Heartbeat: rank 0: memory_peak_bytes -1 < 0"));
}

TEST_F(CoordinatorTest, RegisterWaitsForTheCoordinatorUpToItsTimeout) {
  // Nothing listens on this port: registration must give up at its timeout and say so.
  StartServer(1);
  const int dead_port = server_->port();
  server_.reset();
  CoordinatorClientOptions o;
  o.address = absl::StrCat("127.0.0.1:", dead_port);
  o.token = kToken;
  o.rank = 0;
  auto c = CoordinatorClient::Connect(o);
  ASSERT_TRUE(c.ok());
  const absl::Time start = absl::Now();
  auto job = (*c)->Register(Identity(0), absl::Milliseconds(300));
  EXPECT_CODE(job.status(), kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_THAT(std::string(job.status().message()),
              HasSubstr("rank 0: Register at coordinator 127.0.0.1:"));
  EXPECT_THAT(std::string(job.status().message()),
              HasSubstr("waited for the coordinator to accept registration within 300ms"));
}

TEST_F(CoordinatorTest, LostCoordinatorCountsAsAbort) {
  StartServer(1);
  auto c = ImpatientClient(0);
  absl::Notification lost;
  std::string reason;
  ASSERT_TRUE(c->StartHeartbeats([] { return WorkerReport{}; },
                                    [&](const std::string& r) {
                                      reason = r;
                                      lost.Notify();
                                    })
                  .ok());
  server_.reset();  // the coordinator goes away
  ASSERT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_THAT(reason, HasSubstr("rank 0 lost the coordinator"));
  EXPECT_TRUE(c->aborted());
}

}  // namespace
}  // namespace tandem
