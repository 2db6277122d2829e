// GPU workers under a real Slurm (issue 13): Debian's munged, slurmctld and
// slurmd started here on loopback as a one-node cluster (private config,
// state and sockets in a temporary directory; ports picked free), a real
// `kernelsearch serve --evaluator workers` running a search, and two
// deploy/slurm/gpu-worker.sbatch jobs (with the scripted evaluator) submitted
// with sbatch. One job is scancel'ed while it holds a lease; every candidate
// still ends evaluated exactly once.
//
// Skips, saying why, where Slurm is not installed (scripts/setup_and_build.sh
// installs it) or where this user cannot run the daemons (not root).
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/files.h"
#include "common/subprocess.h"
#include "common/unique_fd.h"
#include "store/lineage_store.h"
#include "server/client.h"
#include "tests/e2e/gpu_worker_checks.h"
#include "tests/e2e/server_harness.h"
#include "tests/testing/paths.h"

namespace ks::e2e {
namespace {

namespace pb = ::kernelsearch::v1;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string Which(const std::string& name) {
  for (const char* dir : {"/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/bin", "/usr/local/sbin"}) {
    fs::path p = fs::path(dir) / name;
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

int FreePort() {
  UniqueFd fd(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return 0;
  socklen_t len = sizeof a;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len);
  return ntohs(a.sin_port);
}

std::string Tail(const std::string& path, size_t bytes = 3000) {
  auto t = ReadFile(path);
  if (!t.ok()) return "(no " + path + ")";
  return t->size() > bytes ? t->substr(t->size() - bytes) : *t;
}

// A one-node Slurm cluster in `dir`, owned by the test: daemons in the
// foreground as children (ChildProcess), stopped in the destructor after every
// job is cancelled.
class SlurmCluster {
 public:
  explicit SlurmCluster(fs::path dir) : dir_(std::move(dir)) {}
  ~SlurmCluster() { Stop(); }

  std::string conf() const { return (dir_ / "slurm.conf").string(); }
  std::map<std::string, std::string> Env() const { return {{"SLURM_CONF", conf()}}; }

  // "" when the cluster is up; else what failed, with the daemons' logs.
  std::string Start() {
    fs::create_directories(dir_ / "munge");
    fs::permissions(dir_ / "munge", fs::perms::owner_all);
    fs::create_directories(dir_ / "state");
    fs::create_directories(dir_ / "spool");
    const std::string key = (dir_ / "munge" / "munge.key").string();
    std::string bytes(1024, '\0');
    {
      UniqueFd rnd(open("/dev/urandom", O_RDONLY));
      if (read(rnd.get(), bytes.data(), bytes.size()) != static_cast<ssize_t>(bytes.size())) return "no /dev/urandom";
    }
    if (!WriteFile(key, bytes).ok()) return "cannot write the munge key";
    fs::permissions(key, fs::perms::owner_read);
    socket_ = (dir_ / "munge" / "munge.socket").string();
    auto munged = ChildProcess::Start({Which("munged"), "--foreground", "--force", "--key-file=" + key,
                                       "--socket=" + socket_, "--log-file=" + (dir_ / "munge" / "munged.log").string(),
                                       "--pid-file=" + (dir_ / "munge" / "munged.pid").string(),
                                       "--seed-file=" + (dir_ / "munge" / "munged.seed").string()},
                                      {}, (dir_ / "munged.stderr").string());
    if (!munged.ok()) return "munged: " + munged.status().ToString();
    munged_ = std::move(*munged);
    if (!WaitFor([&] { return fs::exists(socket_); }, 10s))
      return "munged did not create its socket:\n" + Tail((dir_ / "munge" / "munged.log").string()) +
             Tail((dir_ / "munged.stderr").string());

    char host[256] = {};
    gethostname(host, sizeof host - 1);
    node_ = std::string(host).substr(0, std::string(host).find('.'));
    const char* user = std::getenv("USER");
    std::string me = getuid() == 0 ? "root" : (user ? user : "root");
    std::string d = dir_.string();
    std::string text = "ClusterName=kstest\n"
                       "SlurmctldHost=" + node_ + "(127.0.0.1)\n"
                       "SlurmUser=" + me + "\nSlurmdUser=" + me + "\n"
                       "SlurmctldPort=" + std::to_string(FreePort()) + "\n"
                       "SlurmdPort=" + std::to_string(FreePort()) + "\n"
                       "AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket=" + socket_ + "\n"
                       "StateSaveLocation=" + d + "/state\nSlurmdSpoolDir=" + d + "/spool\n"
                       "SlurmctldPidFile=" + d + "/slurmctld.pid\nSlurmdPidFile=" + d + "/slurmd.pid\n"
                       "SlurmctldLogFile=" + d + "/slurmctld.log\nSlurmdLogFile=" + d + "/slurmd.log\n"
                       // No cgroups or systemd in a CI container: plain process tracking.
                       "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                       "JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n"
                       "JobCompType=jobcomp/none\nSwitchType=switch/none\nMpiDefault=none\n"
                       "ReturnToService=2\nSchedulerType=sched/builtin\n"
                       "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
                       "InactiveLimit=0\nKillWait=5\nMinJobAge=300\n"
                       "NodeName=" + node_ + " NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN\n"
                       "PartitionName=debug Nodes=" + node_ + " Default=YES MaxTime=INFINITE State=UP\n";
    if (!WriteFile(conf(), text).ok()) return "cannot write slurm.conf";
    auto ctld = ChildProcess::Start({Which("slurmctld"), "-D", "-i", "-f", conf()}, Env(),
                                    (dir_ / "slurmctld.stderr").string());
    if (!ctld.ok()) return "slurmctld: " + ctld.status().ToString();
    slurmctld_ = std::move(*ctld);
    auto slurmd = ChildProcess::Start({Which("slurmd"), "-D", "-f", conf(), "-N", node_}, Env(),
                                      (dir_ / "slurmd.stderr").string());
    if (!slurmd.ok()) return "slurmd: " + slurmd.status().ToString();
    slurmd_ = std::move(*slurmd);
    bool idle = WaitFor([&] { return Run({"sinfo", "-h", "-o", "%T"}).find("idle") != std::string::npos; }, 45s);
    if (!idle)
      return "the node never became idle (sinfo: " + Run({"sinfo", "-h", "-o", "%T"}) + ")\nslurmctld:\n" +
             Tail(d + "/slurmctld.log") + Tail(d + "/slurmctld.stderr") + "\nslurmd:\n" + Tail(d + "/slurmd.log") +
             Tail(d + "/slurmd.stderr");
    return "";
  }

  // Runs a Slurm client command; its stdout (and stderr, after it).
  std::string Run(std::vector<std::string> argv, std::map<std::string, std::string> env = {}) const {
    SubprocessOptions o;
    argv[0] = Which(argv[0]);
    o.argv = std::move(argv);
    o.env = Env();
    for (auto& [k, v] : env) o.env[k] = v;
    o.timeout_s = 30;
    auto r = RunSubprocess(o);
    if (!r.ok()) return r.status().ToString();
    return r->out + r->err;
  }

  bool NoJobs() const { return Run({"squeue", "-h", "-o", "%i"}).find_first_not_of(" \n") == std::string::npos; }

  void Stop() {
    if (!slurmctld_.running()) return;
    Run({"scancel", "--full", "--user=" + std::string(getuid() == 0 ? "root" : std::getenv("USER"))});
    WaitFor([&] { return NoJobs(); }, 30s);
    for (ChildProcess* c : {&slurmd_, &slurmctld_, &munged_})
      if (c->running()) {
        ::kill(c->pid(), SIGTERM);
        WaitFor([&] { return c->TryReap().has_value(); }, 10s);
      }
  }

  template <typename F>
  static bool WaitFor(F done, std::chrono::seconds limit) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (done()) return true;
      std::this_thread::sleep_for(100ms);
    }
    return done();
  }

 private:
  fs::path dir_;
  std::string socket_;
  std::string node_;
  ChildProcess munged_, slurmctld_, slurmd_;
};

TEST(SlurmE2E, TwoWorkerJobsOneScancelledEveryCandidateEvaluatedOnce) {
  for (const char* bin : {"munged", "slurmctld", "slurmd", "sbatch", "scancel", "squeue", "sinfo", "srun"})
    if (Which(bin).empty())
      GTEST_SKIP() << "Slurm is not installed (no " << bin
                   << "); scripts/setup_and_build.sh installs slurmctld slurmd slurm-client munge";

  ServerHarness h({.eval_delay_ms = 1500, .evaluator = "workers"});
  SlurmCluster slurm(fs::path(h.Path("slurm")));
  if (std::string why = slurm.Start(); !why.empty()) {
    if (getuid() != 0) GTEST_SKIP() << "cannot run the Slurm daemons as this user (CI runs as root): " << why;
    FAIL() << "starting a one-node Slurm cluster: " << why;
  }

  StartedSearch started = StartSmallSearch(h);
  ASSERT_FALSE(started.search_id.empty());

  // The shipped job script, less its GPU request (this node has no GPUs).
  auto script = ReadFile(ks::testing::SourcePath("deploy/slurm/gpu-worker.sbatch"));
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  std::string local;
  for (size_t pos = 0; pos < script->size();) {
    size_t end = script->find('\n', pos);
    if (end == std::string::npos) end = script->size();
    std::string line = script->substr(pos, end - pos);
    if (line.find("--gpus-per-node") == std::string::npos || line.rfind("#SBATCH", 0) != 0) local += line + "\n";
    pos = end + 1;
  }
  ASSERT_TRUE(WriteFile(h.Path("gpu-worker.sbatch"), local).ok());
  std::map<std::string, std::string> env = {
      {"KS_SERVER", h.address()},
      {"KS_TOKEN_FILE", h.Path("token")},
      {"KS_BIN", ks::testing::CliBinary()},
      {"KS_GPUS", "0"},
      {"KS_EVALUATOR", "fake:" + h.Path("evaluator.json")},
      {"KS_WORKER_ARGS", "--lease-seconds 5 --poll 0.2"}};
  std::vector<std::string> jobs;
  for (int i = 0; i < 2; ++i) {
    std::string out = slurm.Run({"sbatch", "--parsable", "--cpus-per-task=1", "--time=10",
                                 "--output=" + h.Path("job-%j.out"), h.Path("gpu-worker.sbatch")},
                                env);
    std::string id = out.substr(0, out.find_first_of(";\n"));
    ASSERT_FALSE(id.empty() || id.find_first_not_of("0123456789") != std::string::npos) << "sbatch: " << out;
    jobs.push_back(id);
  }

  // The first job's first lease; scancel it while the 1.5 s evaluation runs.
  int64_t victim = 0;
  const std::string tag = "/slurm-" + jobs[0] + "/";
  SlurmCluster::WaitFor(
      [&] {
        for (const auto& l : LeasesFromServerLog(h.Log()))
          if (l.worker.find(tag) != std::string::npos) victim = l.candidate;
        return victim != 0;
      },
      60s);
  ASSERT_NE(victim, 0) << "job " << jobs[0] << " never leased\n"
                       << h.Log() << Tail(h.Path("job-" + jobs[0] + ".out"));
  std::this_thread::sleep_for(300ms);
  slurm.Run({"scancel", jobs[0]});

  pb::GetSearchRequest get;
  get.set_search_id(started.search_id);
  pb::SearchInfo info;
  SlurmCluster::WaitFor(
      [&] {
        auto r = started.client->GetSearch(get);
        if (r.ok()) info = *r;
        return r.ok() && info.state() != pb::QUEUED && info.state() != pb::RUNNING;
      },
      90s);
  EXPECT_EQ(info.state(), pb::SUCCEEDED) << info.DebugString() << h.Log() << Tail(h.Path("job-" + jobs[1] + ".out"));
  slurm.Run({"scancel", jobs[1]});
  EXPECT_TRUE(SlurmCluster::WaitFor([&] { return slurm.NoJobs(); }, 30s)) << slurm.Run({"squeue"});

  // The scancelled worker gave its lease back; the other job evaluated it.
  auto out0 = ReadFile(h.Path("job-" + jobs[0] + ".out"));
  ASSERT_TRUE(out0.ok());
  EXPECT_NE(out0->find("SIGTERM, gave 1 lease(s) back"), std::string::npos) << *out0;
  bool moved = false;
  for (const auto& l : LeasesFromServerLog(h.Log()))
    if (l.candidate == victim && l.attempt >= 2 && l.worker.find("/slurm-" + jobs[1] + "/") != std::string::npos)
      moved = true;
  EXPECT_TRUE(moved) << h.Log();

  auto store = store::LineageStore::Open(h.db());
  ASSERT_TRUE(store.ok());
  ExpectEachEvaluatedOnce(store->get(), std::stoll(started.search_id), h.Evaluated(), {victim});
}

}  // namespace
}  // namespace ks::e2e
