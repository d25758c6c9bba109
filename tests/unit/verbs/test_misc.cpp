/* SPDX-License-Identifier: MIT */
/*
 * The exports of provider/verbs_misc.cpp, verbs_private.cpp and
 * verbs_compat.cpp through the C ABI of the drop-in libibverbs.so.1: the
 * values they return, and their errno for bad arguments.
 *
 * Tags: [.][fork-safe] runs in a process with RDMAV_FORK_SAFE=1, [.][eth] in
 * one with SHMVERBS_LINK_LAYER=eth, [.][fork-after-queue] and
 * [.][fork-env-late] each in a fresh process of their own
 * (tests/meson.build).
 */
#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <shmverbs/shmverbs.h>

#include <catch2/catch.hpp>

#include "../common/fixtures.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

/* Exported by libibverbs.so.1 but declared only in rdma-core's private
 * headers: declared here in our own words, as a provider would see them. */
extern "C" {
const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);
int ibv_dontfork_range(void *base, size_t size);
int ibv_dofork_range(void *base, size_t size);
void ibv_copy_ah_attr_from_kern(struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src);
void ibv_copy_qp_attr_from_kern(struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src);
void ibv_copy_path_rec_from_kern(struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src);
void ibv_copy_path_rec_to_kern(struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src);

int ibv_cmd_alloc_pd(struct ibv_context *, struct ibv_pd *, void *, size_t, void *, size_t);
int ibv_cmd_destroy_qp(struct ibv_qp *);
int ibv_cmd_poll_cq(struct ibv_cq *, int, struct ibv_wc *);
int execute_ioctl(struct ibv_context *, void *);
unsigned int __ioctl_final_num_attrs(unsigned int, void *);
struct ibv_context *verbs_open_device(struct ibv_device *, void *);
void *_verbs_init_and_alloc_context(struct ibv_device *, int, size_t, void *, uint32_t);
void verbs_register_driver_34(const void *);
void __verbs_log(struct verbs_context *, uint32_t, const char *, ...);
int ibv_read_ibdev_sysfs_file(char *, size_t, void *, const char *, ...);
extern bool verbs_allow_disassociate_destroy;
}

namespace {

using shmv_test::OpenDevice;

} // namespace

/* ------------------------------------------------------------------------ */

TEST_CASE("enum strings are rdma-core's, 'unknown' out of range", "[misc]")
{
	struct {
		int value;
		const char *text;
	} nodes[] = {
		{IBV_NODE_CA, "InfiniBand channel adapter"}, {IBV_NODE_SWITCH, "InfiniBand switch"},
		{IBV_NODE_ROUTER, "InfiniBand router"},      {IBV_NODE_RNIC, "iWARP NIC"},
		{IBV_NODE_USNIC, "usNIC"},                   {IBV_NODE_USNIC_UDP, "usNIC UDP"},
		{IBV_NODE_UNSPECIFIED, "unspecified"},       {IBV_NODE_UNKNOWN, "unknown"},
		{42, "unknown"},
	};
	for (auto &n : nodes)
		CHECK(std::string(ibv_node_type_str(static_cast<ibv_node_type>(n.value))) == n.text);

	struct {
		int value;
		const char *text;
	} ports[] = {
		{IBV_PORT_NOP, "no state change (NOP)"}, {IBV_PORT_DOWN, "down"},
		{IBV_PORT_INIT, "init"},                 {IBV_PORT_ARMED, "armed"},
		{IBV_PORT_ACTIVE, "active"},             {IBV_PORT_ACTIVE_DEFER, "active defer"},
		{6, "unknown"},
	};
	for (auto &p : ports)
		CHECK(std::string(ibv_port_state_str(static_cast<ibv_port_state>(p.value))) == p.text);

	struct {
		int value;
		const char *text;
	} events[] = {
		{IBV_EVENT_CQ_ERR, "CQ error"},
		{IBV_EVENT_QP_FATAL, "local work queue catastrophic error"},
		{IBV_EVENT_QP_REQ_ERR, "invalid request local work queue error"},
		{IBV_EVENT_QP_ACCESS_ERR, "local access violation work queue error"},
		{IBV_EVENT_COMM_EST, "communication established"},
		{IBV_EVENT_SQ_DRAINED, "send queue drained"},
		{IBV_EVENT_PATH_MIG, "path migrated"},
		{IBV_EVENT_PATH_MIG_ERR, "path migration request error"},
		{IBV_EVENT_DEVICE_FATAL, "local catastrophic error"},
		{IBV_EVENT_PORT_ACTIVE, "port active"},
		{IBV_EVENT_PORT_ERR, "port error"},
		{IBV_EVENT_LID_CHANGE, "LID change"},
		{IBV_EVENT_PKEY_CHANGE, "P_Key change"},
		{IBV_EVENT_SM_CHANGE, "SM change"},
		{IBV_EVENT_SRQ_ERR, "SRQ catastrophic error"},
		{IBV_EVENT_SRQ_LIMIT_REACHED, "SRQ limit reached"},
		{IBV_EVENT_QP_LAST_WQE_REACHED, "last WQE reached"},
		{IBV_EVENT_CLIENT_REREGISTER, "client reregistration"},
		{IBV_EVENT_GID_CHANGE, "GID table change"},
		{IBV_EVENT_WQ_FATAL, "WQ fatal"},
		{IBV_EVENT_WQ_FATAL + 1, "unknown"},
	};
	for (auto &ev : events)
		CHECK(std::string(ibv_event_type_str(static_cast<ibv_event_type>(ev.value))) == ev.text);

	struct {
		int value;
		const char *text;
	} statuses[] = {
		{IBV_WC_SUCCESS, "success"},
		{IBV_WC_LOC_LEN_ERR, "local length error"},
		{IBV_WC_LOC_QP_OP_ERR, "local QP operation error"},
		{IBV_WC_LOC_EEC_OP_ERR, "local EE context operation error"},
		{IBV_WC_LOC_PROT_ERR, "local protection error"},
		{IBV_WC_WR_FLUSH_ERR, "Work Request Flushed Error"},
		{IBV_WC_MW_BIND_ERR, "memory management operation error"},
		{IBV_WC_BAD_RESP_ERR, "bad response error"},
		{IBV_WC_LOC_ACCESS_ERR, "local access error"},
		{IBV_WC_REM_INV_REQ_ERR, "remote invalid request error"},
		{IBV_WC_REM_ACCESS_ERR, "remote access error"},
		{IBV_WC_REM_OP_ERR, "remote operation error"},
		{IBV_WC_RETRY_EXC_ERR, "transport retry counter exceeded"},
		{IBV_WC_RNR_RETRY_EXC_ERR, "RNR retry counter exceeded"},
		{IBV_WC_LOC_RDD_VIOL_ERR, "local RDD violation error"},
		{IBV_WC_REM_INV_RD_REQ_ERR, "remote invalid RD request"},
		{IBV_WC_REM_ABORT_ERR, "aborted error"},
		{IBV_WC_INV_EECN_ERR, "invalid EE context number"},
		{IBV_WC_INV_EEC_STATE_ERR, "invalid EE context state"},
		{IBV_WC_FATAL_ERR, "fatal error"},
		{IBV_WC_RESP_TIMEOUT_ERR, "response timeout error"},
		{IBV_WC_GENERAL_ERR, "general error"},
		{IBV_WC_TM_ERR, "TM error"},
		{IBV_WC_TM_RNDV_INCOMPLETE, "TM software rendezvous"},
		{IBV_WC_TM_RNDV_INCOMPLETE + 1, "unknown"},
	};
	for (auto &s : statuses)
		CHECK(std::string(ibv_wc_status_str(static_cast<ibv_wc_status>(s.value))) == s.text);
}

TEST_CASE("static rate conversions", "[misc]")
{
	/* mult 0: not a multiple of 2.5 Gb/s, so no multiplier conversion. */
	struct {
		ibv_rate rate;
		int mult;
		int mbps;
	} rates[] = {
		{IBV_RATE_2_5_GBPS, 1, 2500},	  {IBV_RATE_5_GBPS, 2, 5000},
		{IBV_RATE_10_GBPS, 4, 10000},	  {IBV_RATE_20_GBPS, 8, 20000},
		{IBV_RATE_30_GBPS, 12, 30000},	  {IBV_RATE_40_GBPS, 16, 40000},
		{IBV_RATE_60_GBPS, 24, 60000},	  {IBV_RATE_80_GBPS, 32, 80000},
		{IBV_RATE_120_GBPS, 48, 120000},  {IBV_RATE_14_GBPS, 0, 14062},
		{IBV_RATE_56_GBPS, 0, 56250},	  {IBV_RATE_112_GBPS, 0, 112500},
		{IBV_RATE_168_GBPS, 0, 168750},	  {IBV_RATE_25_GBPS, 0, 25781},
		{IBV_RATE_100_GBPS, 0, 103125},	  {IBV_RATE_200_GBPS, 0, 206250},
		{IBV_RATE_300_GBPS, 0, 309375},	  {IBV_RATE_28_GBPS, 11, 28125},
		{IBV_RATE_50_GBPS, 20, 53125},	  {IBV_RATE_400_GBPS, 160, 425000},
		{IBV_RATE_600_GBPS, 240, 637500}, {IBV_RATE_800_GBPS, 320, 850000},
		{IBV_RATE_1200_GBPS, 480, 1275000},
	};
	for (auto &r : rates) {
		INFO("rate " << r.rate);
		CHECK(ibv_rate_to_mbps(r.rate) == r.mbps);
		CHECK(mbps_to_ibv_rate(r.mbps) == r.rate);
		if (r.mult) {
			CHECK(ibv_rate_to_mult(r.rate) == r.mult);
			CHECK(mult_to_ibv_rate(r.mult) == r.rate);
		} else {
			CHECK(ibv_rate_to_mult(r.rate) == -1);
		}
	}
	CHECK(ibv_rate_to_mult(IBV_RATE_MAX) == -1);
	CHECK(ibv_rate_to_mbps(IBV_RATE_MAX) == -1);
	CHECK(ibv_rate_to_mbps(static_cast<ibv_rate>(99)) == -1);
	CHECK(mult_to_ibv_rate(3) == IBV_RATE_MAX);
	CHECK(mult_to_ibv_rate(0) == IBV_RATE_MAX);
	CHECK(mbps_to_ibv_rate(100000) == IBV_RATE_MAX);
	CHECK(mbps_to_ibv_rate(-1) == IBV_RATE_MAX);
}

/* ------------------------------------------------------------------------ */

TEST_CASE("fork protection: unneeded, and too late once a range was registered", "[misc][fork]")
{
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);
	/* Without ibv_fork_init() a registration only records that it is now
	 * too late to start protecting: later ranges could not be tracked. */
	static char buf[4096];
	CHECK(ibv_dontfork_range(buf, sizeof(buf)) == 0);
	CHECK(ibv_dofork_range(buf, sizeof(buf)) == 0);
	CHECK(ibv_fork_init() == EINVAL);
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);
	/* NULL and empty ranges are no-ops. */
	CHECK(ibv_dontfork_range(nullptr, 4096) == 0);
	CHECK(ibv_dofork_range(buf, 0) == 0);
}

namespace {

/* The byte a forked child reads at addr, or -1 when reading it faults. */
int child_byte(const volatile char *addr)
{
	pid_t pid = fork();
	REQUIRE(pid >= 0);
	if (pid == 0) {
		/* Die of the fault (no core file), not in Catch2's handler. */
		struct rlimit no_core = {0, 0};
		setrlimit(RLIMIT_CORE, &no_core);
		signal(SIGSEGV, SIG_DFL);
		_exit(static_cast<unsigned char>(*addr));
	}
	int status = 0;
	REQUIRE(waitpid(pid, &status, 0) == pid);
	if (WIFSIGNALED(status)) {
		CHECK(WTERMSIG(status) == SIGSEGV);
		return -1;
	}
	return WEXITSTATUS(status);
}

/* Whether a forked child can read *addr (a DONTFORK page is not mapped in
 * it); what it reads there is 'x'. */
bool child_can_read(const volatile char *addr)
{
	const int byte = child_byte(addr);
	if (byte < 0)
		return false;
	CHECK(byte == 'x');
	return true;
}

} // namespace

TEST_CASE("fork: what the application advised a buffer holds after it is registered and "
	  "deregistered",
	  "[misc][fork]")
{
	/* Remote access makes the pages shareable: a new mapping, which has
	 * none of the old one's advice unless it is given again. */
	shmv_test::DeviceWithPd d;
	const long ps = sysconf(_SC_PAGESIZE);
	auto *p = static_cast<char *>(
		mmap(nullptr, 3 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	REQUIRE(p != MAP_FAILED);
	std::memset(p, 'x', 3 * ps);
	REQUIRE(madvise(p, ps, MADV_DONTFORK) == 0);
	REQUIRE(madvise(p + ps, ps, MADV_WIPEONFORK) == 0);
	struct ibv_mr *mr = ibv_reg_mr(d.pd, p, 3 * ps,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	REQUIRE(mr);
	CHECK(child_byte(p) == -1);      /* not in the child */
	CHECK(child_byte(p + ps) == 0);  /* zero in the child */
	CHECK(child_byte(p + 2 * ps) == 'x');
	REQUIRE(ibv_dereg_mr(mr) == 0);
	CHECK(child_byte(p) == -1);
	CHECK(child_byte(p + ps) == 0);
	CHECK(child_byte(p + 2 * ps) == 'x');
	CHECK(p[ps] == 'x'); /* the parent's own pages are untouched */
	munmap(p, 3 * ps);
}

TEST_CASE("fork protection: too late once a CQ, QP or SRQ exists", "[.][fork-after-queue]")
{
	/* libmlx5 marks every queue buffer it allocates with
	 * ibv_dontfork_range(), which before ibv_fork_init() makes it too
	 * late. This process has done nothing with verbs yet: each child
	 * starts from that, creates one kind of queue and tries. */
	for (int kind = 0; kind < 3; kind++) {
		CAPTURE(kind);
		pid_t pid = fork();
		REQUIRE(pid >= 0);
		if (pid == 0) {
			shmv_test::DeviceWithPd d;
			struct ibv_cq *cq = ibv_create_cq(d.ctx, 4, nullptr, nullptr, 0);
			if (!cq)
				_exit(2);
			if (kind == 1) {
				struct ibv_qp_init_attr qa{};
				qa.send_cq = qa.recv_cq = cq;
				qa.qp_type = IBV_QPT_RC;
				qa.cap.max_send_wr = qa.cap.max_recv_wr = 1;
				qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
				if (!ibv_create_qp(d.pd, &qa))
					_exit(2);
			} else if (kind == 2) {
				struct ibv_srq_init_attr sa{};
				sa.attr.max_wr = 1;
				sa.attr.max_sge = 1;
				if (!ibv_create_srq(d.pd, &sa))
					_exit(2);
			}
			_exit(ibv_fork_init() == EINVAL ? 0 : 3);
		}
		int status = 0;
		REQUIRE(waitpid(pid, &status, 0) == pid);
		CHECK(WIFEXITED(status));
		CHECK(WEXITSTATUS(status) == 0);
	}
	/* Without any queue it is not too late. */
	shmv_test::DeviceWithPd d;
	CHECK(ibv_fork_init() == 0);
}

TEST_CASE("fork protection: RDMAV_FORK_SAFE counts only at the first ibv_get_device_list",
	  "[.][fork-env-late]")
{
	/* rdma-core reads it in ibverbs_init(), once: set later, it does
	 * nothing, so a registration still makes ibv_fork_init() too late. */
	REQUIRE_FALSE(std::getenv("RDMAV_FORK_SAFE"));
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	REQUIRE(list);
	ibv_free_device_list(list);
	REQUIRE(setenv("RDMAV_FORK_SAFE", "1", 1) == 0);
	static char buf[4096];
	CHECK(ibv_dontfork_range(buf, sizeof(buf)) == 0);
	CHECK(ibv_fork_init() == EINVAL);
	unsetenv("RDMAV_FORK_SAFE");
}

TEST_CASE("fork protection with RDMAV_FORK_SAFE: counted DONTFORK ranges", "[.][fork-safe]")
{
	REQUIRE(std::getenv("RDMAV_FORK_SAFE"));
	/* The environment initialised it at the first ibv_get_device_list, or
	 * the call below does; calling again is fine. */
	CHECK(ibv_fork_init() == 0);
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);

	long ps = sysconf(_SC_PAGESIZE);
	auto *p = static_cast<char *>(
		mmap(nullptr, 3 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	REQUIRE(p != MAP_FAILED);
	std::memset(p, 'x', 3 * ps);

	/* A sub-page range protects its whole page, and only that page. */
	REQUIRE(ibv_dontfork_range(p + 10, 100) == 0);
	CHECK_FALSE(child_can_read(p));
	CHECK(child_can_read(p + ps));

	/* Overlapping registrations: page 0 twice, page 1 once. */
	REQUIRE(ibv_dontfork_range(p, 2 * ps) == 0);
	CHECK_FALSE(child_can_read(p + ps));
	REQUIRE(ibv_dofork_range(p, 2 * ps) == 0);
	CHECK_FALSE(child_can_read(p)); /* still held by the first range */
	CHECK(child_can_read(p + ps));
	REQUIRE(ibv_dofork_range(p + 10, 100) == 0);
	CHECK(child_can_read(p));

	/* Releasing what was never registered changes nothing. */
	REQUIRE(ibv_dofork_range(p + 2 * ps, ps) == 0);
	CHECK(child_can_read(p + 2 * ps));

	/* madvise failure (unmapped memory): -1, errno ENOMEM, nothing kept. */
	REQUIRE(munmap(p + 2 * ps, ps) == 0);
	errno = 0;
	CHECK(ibv_dontfork_range(p + ps, 2 * ps) == -1);
	CHECK(errno == ENOMEM);
	CHECK(child_can_read(p + ps)); /* the advice on page 1 was undone */
	munmap(p, 2 * ps);
}

TEST_CASE("fork protection with RDMAV_FORK_SAFE: reg_mr marks the range DONTFORK, dereg_mr "
	  "releases it", "[.][fork-safe]")
{
	REQUIRE(std::getenv("RDMAV_FORK_SAFE"));
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	REQUIRE((list && n > 0));
	struct ibv_context *ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	REQUIRE(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	REQUIRE(pd);
	long ps = sysconf(_SC_PAGESIZE);
	auto *p = static_cast<char *>(
		mmap(nullptr, 2 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
	REQUIRE(p != MAP_FAILED);
	std::memset(p, 'x', 2 * ps);
	/* Remote access: the pages are also made shareable (a new mapping),
	 * which must not lose the advice. */
	const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *both = ibv_reg_mr(pd, p, 2 * ps, access);
	REQUIRE(both);
	struct ibv_mr *first = ibv_reg_mr(pd, p, 100, access);
	REQUIRE(first);
	CHECK_FALSE(child_can_read(p));
	CHECK_FALSE(child_can_read(p + ps));
	REQUIRE(ibv_dereg_mr(both) == 0);
	CHECK_FALSE(child_can_read(p)); /* still registered by `first` */
	CHECK(child_can_read(p + ps));
	REQUIRE(ibv_dereg_mr(first) == 0);
	CHECK(child_can_read(p));
	munmap(p, 2 * ps);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
}

/* ------------------------------------------------------------------------ */

TEST_CASE("sysfs helpers read files like rdma-core", "[misc][sysfs]")
{
	const char *env = std::getenv("SYSFS_PATH");
	if (!env)
		CHECK(std::string(ibv_get_sysfs_path()) == "/sys");
	CHECK(ibv_get_sysfs_path() == ibv_get_sysfs_path()); /* computed once */

	char dir[] = "/tmp/shmverbs-sysfs-XXXXXX";
	REQUIRE(mkdtemp(dir));
	auto write_file = [&](const char *name, const char *text) {
		std::string path = std::string(dir) + "/" + name;
		int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
		REQUIRE(fd >= 0);
		REQUIRE(write(fd, text, std::strlen(text)) == ssize_t(std::strlen(text)));
		close(fd);
	};
	write_file("newline", "abc\n");
	write_file("bare", "abcd");

	char buf[16];
	std::memset(buf, 'z', sizeof(buf));
	CHECK(ibv_read_sysfs_file(dir, "newline", buf, sizeof(buf)) == 3);
	CHECK(std::string(buf) == "abc");
	CHECK(ibv_read_sysfs_file(dir, "bare", buf, 5) == 4);
	CHECK(std::string(buf) == "abcd");
	/* Exactly filling the buffer leaves no room for the terminator. */
	CHECK(ibv_read_sysfs_file(dir, "bare", buf, 4) == -1);
	errno = 0;
	CHECK(ibv_read_sysfs_file(dir, "missing", buf, sizeof(buf)) == -1);
	CHECK(errno == ENOENT);
	errno = 0;
	CHECK(ibv_read_sysfs_file(nullptr, "newline", buf, sizeof(buf)) == -1);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_read_sysfs_file(dir, nullptr, buf, sizeof(buf)) == -1);
	CHECK(errno == EINVAL);

	unlink((std::string(dir) + "/newline").c_str());
	unlink((std::string(dir) + "/bare").c_str());
	rmdir(dir);
}

/* ------------------------------------------------------------------------ */

TEST_CASE("kernel ABI conversions copy every field", "[misc][kern]")
{
	struct ib_uverbs_qp_attr k;
	std::memset(&k, 0, sizeof(k));
	k.qp_state = IBV_QPS_RTS;
	k.cur_qp_state = IBV_QPS_RTR;
	k.path_mtu = IBV_MTU_2048;
	k.path_mig_state = IBV_MIG_ARMED;
	k.qkey = 0x11111111;
	k.rq_psn = 0x222222;
	k.sq_psn = 0x333333;
	k.dest_qp_num = 0x444444;
	k.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	k.ah_attr.grh.dgid[0] = 0xfe;
	k.ah_attr.grh.dgid[15] = 0x01;
	k.ah_attr.grh.flow_label = 0x12345;
	k.ah_attr.grh.sgid_index = 3;
	k.ah_attr.grh.hop_limit = 64;
	k.ah_attr.grh.traffic_class = 5;
	k.ah_attr.dlid = 0x77;
	k.ah_attr.sl = 2;
	k.ah_attr.src_path_bits = 1;
	k.ah_attr.static_rate = IBV_RATE_100_GBPS;
	k.ah_attr.is_global = 1;
	k.ah_attr.port_num = 1;
	k.alt_ah_attr.dlid = 0x88;
	k.alt_ah_attr.port_num = 2;
	k.max_send_wr = 10;
	k.max_recv_wr = 11;
	k.max_send_sge = 12;
	k.max_recv_sge = 13;
	k.max_inline_data = 14;
	k.pkey_index = 15;
	k.alt_pkey_index = 16;
	k.en_sqd_async_notify = 1;
	k.sq_draining = 1;
	k.max_rd_atomic = 17;
	k.max_dest_rd_atomic = 18;
	k.min_rnr_timer = 19;
	k.port_num = 1;
	k.timeout = 20;
	k.retry_cnt = 7;
	k.rnr_retry = 6;
	k.alt_port_num = 2;
	k.alt_timeout = 21;

	struct ibv_qp_attr a;
	std::memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_SQD;
	ibv_copy_qp_attr_from_kern(&a, &k);
	CHECK(a.qp_state == IBV_QPS_SQD); /* rdma-core does not copy qp_state */
	CHECK(a.cur_qp_state == IBV_QPS_RTR);
	CHECK(a.path_mtu == IBV_MTU_2048);
	CHECK(a.path_mig_state == IBV_MIG_ARMED);
	CHECK(a.qkey == 0x11111111);
	CHECK(a.rq_psn == 0x222222);
	CHECK(a.sq_psn == 0x333333);
	CHECK(a.dest_qp_num == 0x444444);
	CHECK(a.qp_access_flags == IBV_ACCESS_REMOTE_WRITE);
	CHECK(a.cap.max_send_wr == 10);
	CHECK(a.cap.max_recv_wr == 11);
	CHECK(a.cap.max_send_sge == 12);
	CHECK(a.cap.max_recv_sge == 13);
	CHECK(a.cap.max_inline_data == 14);
	CHECK(a.ah_attr.grh.dgid.raw[0] == 0xfe);
	CHECK(a.ah_attr.grh.dgid.raw[15] == 0x01);
	CHECK(a.ah_attr.grh.flow_label == 0x12345);
	CHECK(a.ah_attr.grh.sgid_index == 3);
	CHECK(a.ah_attr.grh.hop_limit == 64);
	CHECK(a.ah_attr.grh.traffic_class == 5);
	CHECK(a.ah_attr.dlid == 0x77);
	CHECK(a.ah_attr.sl == 2);
	CHECK(a.ah_attr.src_path_bits == 1);
	CHECK(a.ah_attr.static_rate == IBV_RATE_100_GBPS);
	CHECK(a.ah_attr.is_global == 1);
	CHECK(a.ah_attr.port_num == 1);
	CHECK(a.alt_ah_attr.dlid == 0x88);
	CHECK(a.alt_ah_attr.port_num == 2);
	CHECK(a.pkey_index == 15);
	CHECK(a.alt_pkey_index == 16);
	CHECK(a.en_sqd_async_notify == 1);
	CHECK(a.sq_draining == 1);
	CHECK(a.max_rd_atomic == 17);
	CHECK(a.max_dest_rd_atomic == 18);
	CHECK(a.min_rnr_timer == 19);
	CHECK(a.port_num == 1);
	CHECK(a.timeout == 20);
	CHECK(a.retry_cnt == 7);
	CHECK(a.rnr_retry == 6);
	CHECK(a.alt_port_num == 2);
	CHECK(a.alt_timeout == 21);

	/* Path records survive a round trip, and keep network byte order. */
	struct ib_user_path_rec kp;
	std::memset(&kp, 0, sizeof(kp));
	for (int i = 0; i < 16; i++) {
		kp.dgid[i] = uint8_t(i);
		kp.sgid[i] = uint8_t(0x80 + i);
	}
	kp.dlid = htobe16(0x1234);
	kp.slid = htobe16(0x5678);
	kp.raw_traffic = 1;
	kp.flow_label = htobe32(0xabcde);
	kp.reversible = 1;
	kp.mtu = IBV_MTU_4096;
	kp.pkey = htobe16(0xffff);
	kp.hop_limit = 9;
	kp.traffic_class = 8;
	kp.numb_path = 1;
	kp.sl = 3;
	kp.mtu_selector = 2;
	kp.rate_selector = 2;
	kp.rate = IBV_RATE_40_GBPS;
	kp.packet_life_time_selector = 2;
	kp.packet_life_time = 18;
	kp.preference = 4;
	struct ibv_sa_path_rec sa;
	std::memset(&sa, 0, sizeof(sa));
	ibv_copy_path_rec_from_kern(&sa, &kp);
	CHECK(sa.dgid.raw[5] == 5);
	CHECK(sa.sgid.raw[5] == 0x85);
	CHECK(sa.dlid == htobe16(0x1234));
	CHECK(sa.flow_label == htobe32(0xabcde));
	CHECK(sa.mtu == IBV_MTU_4096);
	CHECK(sa.packet_life_time == 18);
	CHECK(sa.preference == 4);
	struct ib_user_path_rec back;
	std::memset(&back, 0, sizeof(back));
	ibv_copy_path_rec_to_kern(&back, &sa);
	CHECK(std::memcmp(&back, &kp, sizeof(kp)) == 0);

	struct ibv_ah_attr ah;
	std::memset(&ah, 0, sizeof(ah));
	ibv_copy_ah_attr_from_kern(&ah, &k.alt_ah_attr);
	CHECK(ah.dlid == 0x88);
	CHECK(ah.port_num == 2);

	/* NULL arguments are ignored rather than dereferenced. */
	ibv_copy_qp_attr_from_kern(nullptr, &k);
	ibv_copy_qp_attr_from_kern(&a, nullptr);
	ibv_copy_ah_attr_from_kern(nullptr, nullptr);
	ibv_copy_path_rec_from_kern(nullptr, &kp);
	ibv_copy_path_rec_to_kern(&back, nullptr);
}

/* ------------------------------------------------------------------------ */

TEST_CASE("L2 resolution needs a RoCE port", "[misc][eth-l2]")
{
	OpenDevice d;
	struct ibv_ah_attr attr {};
	attr.port_num = 1;
	attr.is_global = 1;
	uint8_t mac[ETHERNET_LL_SIZE];
	uint16_t vid;
	CHECK(ibv_resolve_eth_l2_from_gid(nullptr, &attr, mac, &vid) == -EINVAL);
	CHECK(ibv_resolve_eth_l2_from_gid(d.ctx, nullptr, mac, &vid) == -EINVAL);
	CHECK(ibv_resolve_eth_l2_from_gid(d.ctx, &attr, nullptr, &vid) == -EINVAL);
	/* InfiniBand port: no interface to resolve on. */
	CHECK(ibv_resolve_eth_l2_from_gid(d.ctx, &attr, mac, &vid) == -EINVAL);
	/* A source GID index that does not exist: ibv_query_gid's -1. */
	attr.grh.sgid_index = 255;
	CHECK(ibv_resolve_eth_l2_from_gid(d.ctx, &attr, mac, &vid) == -1);
}

TEST_CASE("L2 resolution on the emulated RoCE fabric", "[.][eth]")
{
	OpenDevice d;
	struct ibv_port_attr port;
	REQUIRE(ibv_query_port(d.ctx, 1, &port) == 0);
	REQUIRE(port.link_layer == IBV_LINK_LAYER_ETHERNET);
	union ibv_gid link_local, ipv4;
	REQUIRE(ibv_query_gid(d.ctx, 1, 0, &link_local) == 0);
	REQUIRE(ibv_query_gid(d.ctx, 1, 3, &ipv4) == 0);

	/* The port's MAC, as its link-local GID encodes it (EUI-64). */
	const uint8_t *id = link_local.raw + 8;
	const uint8_t own_mac[6] = {uint8_t(id[0] ^ 2), id[1], id[2], id[5], id[6], id[7]};

	struct {
		const char *what;
		uint8_t dgid[16];
		int ret;
		uint8_t mac[6];
	} cases[] = {
		{"IPv4 multicast 224.1.2.3",
		 {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 224, 1, 2, 3},
		 0,
		 {0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}},
		{"IPv4 multicast 239.129.2.3 keeps 23 bits",
		 {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 239, 129, 2, 3},
		 0,
		 {0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}},
		{"IPv6 multicast ff02::1:2",
		 {0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2},
		 0,
		 {0x33, 0x33, 0, 1, 0, 2}},
		{"link-local fe80::211:22ff:fe33:4455",
		 {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55},
		 0,
		 {0x00, 0x11, 0x22, 0x33, 0x44, 0x55}},
		{"unknown unicast 10.0.0.1",
		 {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1},
		 -EHOSTUNREACH,
		 {}},
	};
	for (auto &c : cases) {
		INFO(c.what);
		struct ibv_ah_attr attr {};
		attr.port_num = 1;
		attr.is_global = 1;
		attr.grh.sgid_index = 3;
		std::memcpy(attr.grh.dgid.raw, c.dgid, 16);
		uint8_t mac[6] = {};
		uint16_t vid = 0;
		CHECK(ibv_resolve_eth_l2_from_gid(d.ctx, &attr, mac, &vid) == c.ret);
		if (c.ret == 0) {
			CHECK(std::memcmp(mac, c.mac, 6) == 0);
			CHECK(vid == 0xffff);
		}
	}

	/* A GID of an emulated port resolves to that port's MAC. */
	struct ibv_ah_attr attr {};
	attr.port_num = 1;
	attr.is_global = 1;
	attr.grh.sgid_index = 3;
	attr.grh.dgid = ipv4;
	uint8_t mac[6] = {};
	CHECK(ibv_resolve_eth_l2_from_gid(d.ctx, &attr, mac, nullptr) == 0);
	CHECK(std::memcmp(mac, own_mac, 6) == 0);

	/* An empty source GID entry has no interface behind it. */
	attr.grh.sgid_index = 10;
	CHECK(ibv_resolve_eth_l2_from_gid(d.ctx, &attr, mac, nullptr) == -EINVAL);
}

/* ------------------------------------------------------------------------ */

TEST_CASE("import and unimport: not supported by the emulated devices", "[misc][import]")
{
	OpenDevice d;
	errno = 0;
	CHECK(ibv_import_device(-1) == nullptr);
	CHECK(errno == EINVAL);
	/* Our own command fd: a device without import support. */
	errno = 0;
	CHECK(ibv_import_device(d.ctx->cmd_fd) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	/* A character device is a real uverbs file: no such device here. */
	int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	REQUIRE(null_fd >= 0);
	errno = 0;
	CHECK(ibv_import_device(null_fd) == nullptr);
	CHECK(errno == ENODEV);
	close(null_fd);
	/* Anything else is not a command fd. */
	int pipe_fds[2];
	REQUIRE(pipe(pipe_fds) == 0);
	errno = 0;
	CHECK(ibv_import_device(pipe_fds[0]) == nullptr);
	CHECK(errno == EINVAL);
	close(pipe_fds[0]);
	close(pipe_fds[1]);

	errno = 0;
	CHECK(ibv_import_pd(nullptr, 1) == nullptr);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_import_pd(d.ctx, 1) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(ibv_import_dm(nullptr, 1) == nullptr);
	CHECK(errno == EINVAL);
	errno = 0;
	CHECK(ibv_import_dm(d.ctx, 1) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(ibv_import_mr(nullptr, 1) == nullptr);
	CHECK(errno == EINVAL);

	struct ibv_pd *pd = ibv_alloc_pd(d.ctx);
	REQUIRE(pd);
	errno = 0;
	CHECK(ibv_import_mr(pd, 1) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	/* Unimporting one of ours leaves it intact: it still deallocates. */
	ibv_unimport_pd(pd);
	ibv_unimport_pd(nullptr);
	ibv_unimport_mr(nullptr);
	ibv_unimport_dm(nullptr);
	CHECK(ibv_dealloc_pd(pd) == 0);
}

TEST_CASE("ECE and in-order data on an emulated QP", "[misc][qp]")
{
	OpenDevice d;
	/* These verbs read nothing of a QP but its context: a bare ibv_qp on
	 * our context stands for a QP of the QP family here. */
	struct ibv_qp qp {};
	qp.context = d.ctx;
	qp.state = IBV_QPS_RTS;

	struct ibv_ece ece {};
	ece.vendor_id = 0xdead;
	ece.options = 7;
	ece.comp_mask = 3;
	REQUIRE(ibv_query_ece(&qp, &ece) == 0);
	CHECK(ece.vendor_id == 0x15b3);
	CHECK(ece.options == 0);
	CHECK(ece.comp_mask == 0);
	CHECK(ibv_query_ece(nullptr, &ece) == EINVAL);
	CHECK(ibv_query_ece(&qp, nullptr) == EINVAL);

	struct {
		const char *what;
		uint32_t vendor, comp_mask;
		int ret;
	} sets[] = {
		{"no vendor", 0, 0, EOPNOTSUPP},
		{"comp_mask", 0x15b3, 1, EINVAL},
		{"another vendor", 0x1234, 0, EINVAL},
		{"valid but unsupported", 0x15b3, 0, EOPNOTSUPP},
	};
	for (auto &s : sets) {
		INFO(s.what);
		struct ibv_ece e {};
		e.vendor_id = s.vendor;
		e.comp_mask = s.comp_mask;
		errno = 0;
		CHECK(ibv_set_ece(&qp, &e) == s.ret);
		CHECK(errno == s.ret);
	}
	errno = 0;
	CHECK(ibv_set_ece(nullptr, &ece) == EINVAL);
	CHECK(errno == EINVAL);
	CHECK(ibv_set_ece(&qp, nullptr) == EINVAL);

	for (auto op : {IBV_WR_RDMA_WRITE, IBV_WR_SEND, IBV_WR_RDMA_READ})
		CHECK(ibv_query_qp_data_in_order(&qp, op, 0) == 0);
	CHECK(ibv_query_qp_data_in_order(&qp, IBV_WR_SEND, 1) == 0);
	CHECK(ibv_query_qp_data_in_order(nullptr, IBV_WR_SEND, 0) == 0);
}

TEST_CASE("shmverbs_is_emulated_device", "[misc]")
{
	OpenDevice d;
	CHECK(shmverbs_is_emulated_device(d.dev) == 1);
	CHECK(shmverbs_is_emulated_device(d.ctx->device) == 1);
	CHECK(shmverbs_is_emulated_device(nullptr) == 0);
	struct ibv_device other {};
	CHECK(shmverbs_is_emulated_device(&other) == 0);
}

/* ------------------------------------------------------------------------ */

TEST_CASE("provider interface without a real libibverbs", "[misc][private]")
{
	OpenDevice d;
	/* Nothing to pass the calls to: errno-returning entries say EOPNOTSUPP. */
	CHECK(ibv_cmd_alloc_pd(d.ctx, nullptr, nullptr, 0, nullptr, 0) == EOPNOTSUPP);
	CHECK(ibv_cmd_destroy_qp(nullptr) == EOPNOTSUPP);
	CHECK(execute_ioctl(d.ctx, nullptr) == EOPNOTSUPP);
	errno = 0;
	CHECK(ibv_cmd_poll_cq(nullptr, 1, nullptr) == -1);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(verbs_open_device(d.dev, nullptr) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	errno = 0;
	CHECK(_verbs_init_and_alloc_context(d.dev, -1, 64, nullptr, 0) == nullptr);
	CHECK(errno == EOPNOTSUPP);
	CHECK(__ioctl_final_num_attrs(3, nullptr) == 3);
	/* A provider's constructor registering itself is ignored. */
	verbs_register_driver_34(nullptr);
	/* Logging is off unless VERBS_LOG_LEVEL and VERBS_LOG_FILE say so. */
	errno = 1234;
	__verbs_log(nullptr, 0, "%s", "shmverbs test\n");
	CHECK(errno == 1234);
	char buf[8];
	errno = 0;
	CHECK(ibv_read_ibdev_sysfs_file(buf, sizeof(buf), nullptr, "ports/%d/state", 1) == -1);
	CHECK(errno == EINVAL);
	CHECK(verbs_allow_disassociate_destroy == false);
}

TEST_CASE("IBVERBS_1.0 compat names fail with ENOSYS", "[misc][compat]")
{
	using GetList = void **(*)(int *);
	using AllocPd = void *(*)(void *);
	using QueryGid = int (*)(void *, uint8_t, int, union ibv_gid *);
	using CloseDevice = int (*)(void *);
	using FreeList = void (*)(void **);
	using RegisterDriver = void (*)(const char *, void *);

	auto get_list = reinterpret_cast<GetList>(dlvsym(RTLD_DEFAULT, "ibv_get_device_list",
							  "IBVERBS_1.0"));
	auto alloc_pd = reinterpret_cast<AllocPd>(dlvsym(RTLD_DEFAULT, "ibv_alloc_pd",
							  "IBVERBS_1.0"));
	auto query_gid = reinterpret_cast<QueryGid>(dlvsym(RTLD_DEFAULT, "ibv_query_gid",
							    "IBVERBS_1.0"));
	auto close_dev = reinterpret_cast<CloseDevice>(dlvsym(RTLD_DEFAULT, "ibv_close_device",
							       "IBVERBS_1.0"));
	auto free_list = reinterpret_cast<FreeList>(dlvsym(RTLD_DEFAULT, "ibv_free_device_list",
							    "IBVERBS_1.0"));
	auto reg_driver = reinterpret_cast<RegisterDriver>(
		dlvsym(RTLD_DEFAULT, "ibv_register_driver", "IBVERBS_1.1"));
	REQUIRE(get_list);
	REQUIRE(alloc_pd);
	REQUIRE(query_gid);
	REQUIRE(close_dev);
	REQUIRE(free_list);
	REQUIRE(reg_driver);
	/* Distinct from the current entry points. */
	CHECK(reinterpret_cast<void *>(get_list) !=
	      dlvsym(RTLD_DEFAULT, "ibv_get_device_list", "IBVERBS_1.1"));

	int n = 7;
	errno = 0;
	CHECK(get_list(&n) == nullptr);
	CHECK(errno == ENOSYS);
	errno = 0;
	CHECK(alloc_pd(nullptr) == nullptr);
	CHECK(errno == ENOSYS);
	union ibv_gid gid;
	errno = 0;
	CHECK(query_gid(nullptr, 1, 0, &gid) == -1);
	CHECK(errno == ENOSYS);
	CHECK(close_dev(nullptr) == ENOSYS);
	free_list(nullptr);
	reg_driver("old", nullptr);
}
