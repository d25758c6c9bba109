/* SPDX-License-Identifier: MIT */
/* The per-device key table: allocation, publication, lookup and withdrawal. */
#include "mr.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

using namespace shmverbs;

namespace {

KeyEntry mr_entry(uint64_t iova, uint64_t length, uint32_t access, uint32_t pdn = 7)
{
	KeyEntry e{};
	e.kind = KeyKind::Mr;
	e.access = access;
	e.pdn = pdn;
	e.iova = iova;
	e.length = length;
	e.addr = iova + 0x1000;
	return e;
}

} // namespace

TEST_CASE("keys: index in the high 24 bits, variant in the low 8", "[keys]")
{
	CHECK(make_key(0x123456, 0x78) == 0x12345678u);
	CHECK(key_index(0x12345678u) == 0x123456u);
	CHECK(key_variant(0x12345678u) == 0x78u);
}

TEST_CASE("publish, acquire, unpublish", "[keys]")
{
	KeyTable t(100);
	uint32_t index;
	REQUIRE(t.reserve(index) == 0);
	CHECK(index >= 3); /* 0 never names a key, 1 would be MLX5_INVALID_LKEY, 2 is the null MR */

	/* Reserved but unpublished: nothing to find. */
	CHECK_FALSE(t.acquire(make_key(index, 0)));
	CHECK_FALSE(t.acquire(make_key(index, 1)));

	uint32_t key = t.publish(index, mr_entry(0x10000, 0x2000, IBV_ACCESS_LOCAL_WRITE), 1);
	CHECK(key == make_key(index, 1));
	{
		KeyRef ref = t.acquire(key);
		REQUIRE(ref);
		CHECK(ref->kind == KeyKind::Mr);
		CHECK(ref->pdn == 7);
		CHECK(ref.address_of(0x10010) == 0x11010);
	}
	/* Another variant of the same index is a stale key. */
	CHECK_FALSE(t.acquire(make_key(index, 2)));
	CHECK_FALSE(t.acquire(make_key(index, 0)));
	/* Keys outside the table, and key 0. */
	CHECK_FALSE(t.acquire(0));
	CHECK_FALSE(t.acquire(0xffffffffu));
	CHECK_FALSE(t.acquire(make_key(index + 1, 1)));

	t.unpublish(index);
	CHECK_FALSE(t.acquire(key));
	uint32_t key2 = t.publish(index, mr_entry(0, 10, 0), uint8_t(t.variant(index) + 1));
	CHECK(key2 != key);
	CHECK_FALSE(t.acquire(key));
	CHECK(t.acquire(key2));
	t.unpublish(index);
	t.release(index);
	CHECK(t.mr_count() == 0);
}

TEST_CASE("permits: range and access", "[keys]")
{
	KeyTable t(10);
	uint32_t index;
	REQUIRE(t.reserve(index) == 0);
	const uint32_t access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
	uint32_t key = t.publish(index, mr_entry(1000, 100, access), 1);
	KeyRef ref = t.acquire(key);
	REQUIRE(ref);
	struct Row {
		uint64_t iova, length;
		uint32_t access;
		bool ok;
	};
	const Row rows[] = {
		{1000, 100, 0, true},
		{1000, 100, IBV_ACCESS_LOCAL_WRITE, true},
		{1050, 50, IBV_ACCESS_REMOTE_READ, true},
		{1100, 0, 0, true},
		{999, 1, 0, false},
		{1000, 101, 0, false},
		{1099, 2, 0, false},
		{1101, 0, 0, false},
		{1000, 10, IBV_ACCESS_REMOTE_WRITE, false},
		{1000, 10, IBV_ACCESS_REMOTE_ATOMIC, false},
		{1000, 10, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE, false},
		{1050, UINT64_MAX, 0, false},
	};
	for (const Row &r : rows) {
		INFO("iova " << r.iova << " length " << r.length << " access " << r.access);
		CHECK(ref.permits(r.iova, r.length, r.access) == r.ok);
	}
}

TEST_CASE("the null MR key is permanent and grants local access anywhere", "[keys]")
{
	KeyTable t(10);
	KeyRef ref = t.acquire(t.null_key());
	REQUIRE(ref);
	CHECK(ref->kind == KeyKind::NullMr);
	CHECK(ref.permits(0, UINT64_MAX, IBV_ACCESS_LOCAL_WRITE));
	CHECK(ref.permits(0xdead0000, 64, 0));
	CHECK_FALSE(ref.permits(0, 64, IBV_ACCESS_REMOTE_READ));
	CHECK(t.null_key() != 0x100); /* MLX5_INVALID_LKEY */
}

TEST_CASE("device limits and index exhaustion", "[keys]")
{
	SECTION("the MR limit")
	{
		KeyTable t(3);
		uint32_t index;
		for (int i = 0; i < 3; i++)
			REQUIRE(t.reserve(index) == 0);
		CHECK(t.reserve(index) == ENOMEM);
		t.release(index);
		CHECK(t.reserve(index) == 0);
	}
	SECTION("a small index space runs out, then recycles")
	{
		KeyTable t(1000, 8); /* indices 3..7 */
		std::set<uint32_t> got;
		uint32_t index;
		for (int i = 0; i < 5; i++) {
			REQUIRE(t.reserve(index) == 0);
			CHECK(got.insert(index).second);
		}
		CHECK(t.reserve(index) == ENOMEM);
		t.release(5);
		REQUIRE(t.reserve(index) == 0);
		CHECK(index == 5);
	}
}

TEST_CASE("freed indices are not reused at once", "[keys]")
{
	KeyTable t(100000);
	std::set<uint32_t> seen;
	uint32_t index;
	for (int i = 0; i < 200; i++) {
		REQUIRE(t.reserve(index) == 0);
		CHECK(seen.insert(index).second);
		t.release(index);
	}
}

TEST_CASE("unpublish waits for the readers of the key", "[keys][threads]")
{
	KeyTable t(10);
	uint32_t index;
	REQUIRE(t.reserve(index) == 0);
	uint32_t key = t.publish(index, mr_entry(0, 64, 0), 1);

	KeyRef held = t.acquire(key);
	REQUIRE(held);
	std::atomic<bool> done{false};
	std::thread writer([&] {
		t.unpublish(index);
		done = true;
	});
	/* The key is withdrawn at once, but unpublish() does not return while
	 * our reference exists. */
	auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
	while (t.acquire(key) && std::chrono::steady_clock::now() < deadline)
		std::this_thread::yield();
	CHECK_FALSE(t.acquire(key));
	std::this_thread::sleep_for(std::chrono::milliseconds(20));
	CHECK_FALSE(done);
	held.release();
	writer.join();
	CHECK(done);
}

TEST_CASE("lookups racing with republication see whole entries", "[keys][threads]")
{
	KeyTable t(10);
	uint32_t index;
	REQUIRE(t.reserve(index) == 0);
	/* Every published entry satisfies addr == iova * 3 and length == iova. */
	auto entry = [](uint64_t n) {
		KeyEntry e{};
		e.kind = KeyKind::Mr;
		e.iova = n;
		e.length = n;
		e.addr = n * 3;
		return e;
	};
	std::atomic<uint32_t> current{t.publish(index, entry(1), 1)};
	std::atomic<bool> stop{false};
	std::atomic<int> torn{0}, hits{0};
	std::vector<std::thread> readers;
	for (int r = 0; r < 2; r++)
		readers.emplace_back([&] {
			while (!stop) {
				KeyRef ref = t.acquire(current.load());
				if (!ref)
					continue;
				hits++;
				if (ref->addr != ref->iova * 3 || ref->length != ref->iova)
					torn++;
			}
		});
	/* Republish until the readers have had their chances (bounded). */
	auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
	for (uint64_t n = 2; (n < 2000 || hits < 1000) && std::chrono::steady_clock::now() < deadline;
	     n++) {
		t.unpublish(index);
		current = t.publish(index, entry(n), uint8_t(t.variant(index) + 1));
		if (n % 64 == 0)
			std::this_thread::yield();
	}
	stop = true;
	for (std::thread &r : readers)
		r.join();
	CHECK(torn == 0);
	CHECK(hits > 0);
}

TEST_CASE("unpublish waits 2 s for an unattributed hold, and a hold it gave up on only once",
	  "[keys][threads]")
{
	KeyTable t(10);
	uint32_t index;
	REQUIRE(t.reserve(index) == 0);
	uint32_t key = t.publish(index, mr_entry(0, 64, 0), 1);
	/* What a process beyond the slot's holder entries leaves when it is
	 * killed mid-hold: an anonymous count nobody takes back. */
	KeyRef ref = t.acquire(key);
	REQUIRE(ref);
	auto &slot = const_cast<KeySlot &>(*ref.slot());
	ref.release();
	slot.anonymous.fetch_add(1);

	auto timed_unpublish = [&] {
		const auto t0 = std::chrono::steady_clock::now();
		t.unpublish(index);
		return std::chrono::steady_clock::now() - t0;
	};
	const auto first = timed_unpublish();
	CHECK(first >= std::chrono::milliseconds(1900));
	CHECK(first < std::chrono::seconds(5));
	key = t.publish(index, mr_entry(0, 64, 0), uint8_t(t.variant(index) + 1));
	CHECK(timed_unpublish() < std::chrono::milliseconds(500));

	/* A second such hold is waited for again; the one given up on not. */
	key = t.publish(index, mr_entry(0, 64, 0), uint8_t(t.variant(index) + 1));
	slot.anonymous.fetch_add(1);
	CHECK(timed_unpublish() >= std::chrono::milliseconds(1900));

	/* try_unpublish, for a window's send queue: false until 2 s after the
	 * first try, then true. */
	key = t.publish(index, mr_entry(0, 64, 0), uint8_t(t.variant(index) + 1));
	slot.anonymous.fetch_add(1);
	KeyTable::Wait wait;
	CHECK_FALSE(t.try_unpublish(index, wait));
	CHECK(wait.since != std::chrono::steady_clock::time_point{});
	wait.since -= std::chrono::milliseconds(2100);
	CHECK(t.try_unpublish(index, wait));
	KeyTable::Wait again;
	CHECK(t.try_unpublish(index, again));

	/* A wait whose last try is long past (the WR that waited was
	 * flushed) starts over: its old clock gives nothing up. */
	key = t.publish(index, mr_entry(0, 64, 0), uint8_t(t.variant(index) + 1));
	slot.anonymous.fetch_add(1);
	KeyTable::Wait stale;
	CHECK_FALSE(t.try_unpublish(index, stale));
	stale.since -= std::chrono::seconds(3);
	stale.last -= std::chrono::seconds(3);
	CHECK_FALSE(t.try_unpublish(index, stale));
	slot.anonymous.fetch_sub(1);
	CHECK(t.try_unpublish(index, stale));

	/* Those holds let go after all (they were alive): once a withdrawal
	 * has seen that, nothing is left to skip, and a new one is waited for. */
	slot.anonymous.fetch_sub(3);
	key = t.publish(index, mr_entry(0, 64, 0), uint8_t(t.variant(index) + 1));
	CHECK(timed_unpublish() < std::chrono::milliseconds(500));
	key = t.publish(index, mr_entry(0, 64, 0), uint8_t(t.variant(index) + 1));
	slot.anonymous.fetch_add(1);
	KeyTable::Wait fresh;
	CHECK_FALSE(t.try_unpublish(index, fresh));
	slot.anonymous.fetch_sub(1);
	CHECK(t.try_unpublish(index, fresh));

	/* A give-up writes off the fewest holds its tries saw, not a count
	 * that was up for a moment (an acquire that found the key withdrawn
	 * and took its count back), so a hold that came later is waited for. */
	key = t.publish(index, mr_entry(0, 64, 0), uint8_t(t.variant(index) + 1));
	slot.anonymous.fetch_add(1); /* a dead process's */
	KeyTable::Wait brief;
	CHECK_FALSE(t.try_unpublish(index, brief));
	slot.anonymous.fetch_add(1); /* the passing acquire */
	brief.since -= std::chrono::milliseconds(2100);
	CHECK(t.try_unpublish(index, brief));
	slot.anonymous.fetch_sub(1); /* it let go */
	key = t.publish(index, mr_entry(0, 64, 0), uint8_t(t.variant(index) + 1));
	slot.anonymous.fetch_add(1); /* a live hold */
	KeyTable::Wait later;
	CHECK_FALSE(t.try_unpublish(index, later));
	slot.anonymous.fetch_sub(2);
	CHECK(t.try_unpublish(index, later));
	t.release(index);
}
