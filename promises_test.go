package tinymq_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// promises is the index of the README's promises (its Guarantees and
// Durability sections, one row per paragraph or per sentence that promises
// something on its own) and the tests that prove each. A name prefixed
// "wal." is a test of internal/wal. TestEveryPromiseHasATest keeps the index
// true: a test renamed or removed without updating this table fails it.
var promises = []struct {
	promise string
	tests   []string
}{
	// Guarantees
	{"By default TinyMQ keeps messages in memory; queues registered WithDurable() on an MQ with WithDataDir(dir) keep their messages in a write-ahead log", []string{
		"TestDurableMessagesSurviveARestart", "TestDurableNeedsANameAndADataDir",
	}},
	{"Accepted means accounted for: Publish returns nil only when every queue the message routes to has accepted it; otherwise no queue has it (all or nothing, also under a concurrent Stop)", []string{
		"TestStopRacingPublishersLosesNothing", "TestPublishRacingStopOrShutdownEndsEveryAcceptedMessageOnce",
		"TestMaxLenRejectPublishIsAllOrNothing", "TestRoutingValidation",
		"TestShutdownDeadlineRacingDurablePublishesAccountsForEach", "TestDurablePublishHoldsNoLockAcrossItsSync",
	}},
	{"An accepted message ends in exactly one way (succeeded, dead-lettered, dropped, undelivered), each counted in Stats()", []string{
		"TestStressEveryAcceptedMessageEndsOnce", "TestTortureLedger", "TestStatsReconcile",
		"TestDeadMessagesWithoutDeadLetterExchangeAreLoggedAndCounted", "TestStopBeforeStart",
		"TestShutdownDeadlineCancelsConsumersAndCountsUndelivered",
	}},
	{"Delivery: each queue bound at the moment of Publish gets the message once (its own Msg, sharing Data and Headers)", []string{
		"TestFanoutDeliversEveryAcceptedMessageOnceToEveryQueue", "TestEveryQueueGetsItsOwnCopySharingData",
		"TestEachQueueOwnsItsMsg", "TestConsumersMayKeepAndModifyTheirMsg", "TestKeptMsgIsUntouchedByRetryAndDeadLetter",
		"TestQueueRegisteredWhilePublishingGetsEveryLaterMessage", "TestTopicQueueWithSeveralMatchingBindingsGetsOneCopy",
		"TestConcurrentPublishersMayShareOneHeaderTable", "TestFifoGivesBackEachEntryAsItWentIn",
	}},
	{"Without WithRetry the consumer is called once; with WithRetry a message is redelivered after an error or a panic until it succeeds or uses its attempts; Permanent(err) skips the remaining attempts", []string{
		"TestRetryBackoffIsExponentialCappedAndDeadLetters", "TestPermanentErrorsAndPanics",
		"TestPermanentAnywhereInTheChainSkipsRetries", "TestRetryDeliversACopyThatStaysInItsQueue",
		"TestRetriesOfOnePublishAreIsolatedPerQueue", "TestEveryConsumerFormRetriesDeadLettersAndCountsFailuresAlike",
	}},
	{"An expired message is never handed to a consumer; at the head of its queue it is dead-lettered with reason expired at once, even while every consumer is busy; only the head is watched", []string{
		"TestTTLExpiredMessagesNeverReachTheConsumer", "TestExpiryAtTheHeadIsOnTime", "TestShortTTLBehindALongOneWaits",
	}},
	{"Counts: Depth and the limit of WithMaxLen count every message that waits (ready, taken in a batch but not begun, delayed or retrying), not the ones in a consumer", []string{
		"TestDepthCountsMessagesTakenInABatch", "TestMaxLenCountsEveryWaitingMessage",
	}},
	{"A retry that finds its queue full makes room as a publish would (DropHead evicts the oldest, otherwise reason maxlen)", []string{
		"TestRetryIntoAFullQueueKeepsTheLimit", "TestMaxLenDropHeadDeadLettersTheOldest",
	}},
	{"A slow message never holds back the ones taken with it in a batch while a worker is idle", []string{
		"TestSlowMessageDoesNotHoldItsBatch", "TestBlockedBatchIsTakenByIdleWorkers",
		"TestASubscriptionLeavingTakesNoWakeFromTheWorkersThatStay",
		"TestIdleWorkersWakeForMessagesThatArrive", "TestIdleWorkerStealsFromABatch",
		"TestParkedWorkerWakesAfterAStrayWake", "TestParkedWorkersWakeAfterEveryTopologyChange",
		"TestAPublishWhileTheWorkerParksReachesIt", "TestPlainPublishesReachParkedWorkers",
	}},
	{"The sums of Stats() hold exactly once a queue is idle, and InFlight never exceeds the queue's concurrency", []string{
		"TestStatsAreExactUnderConcurrentLoad", "TestStatsSnapshotsStayConsistentWhileMessagesMove",
		"TestStatsWhileEveryWorkerIsBlocked", "TestInFlightNeverExceedsConcurrency", "TestHandlerStatsAreExactUnderConcurrency",
		"TestPublishedCountsOnlyAcceptedDeadLetters",
	}},
	{"Dead-lettering follows RabbitMQ: one death record per queue and reason with a Count; a second death increments it and moves it to the front, keeping the first's exchange, routing key, message ID and time", []string{
		"TestDeathRecordsCountLaps", "TestDeathCountDoesNotRewriteEarlierCopies", "TestDeathRecordsAreIsolatedPerQueue",
	}},
	{"A dead letter is not all or nothing: a full or shut target queue does not get its copy, the others do", []string{
		"TestDeadLetterRefusedByOneFullQueueReachesTheOthers", "TestPublishedCountsOnlyAcceptedDeadLetters",
	}},
	{"Cycles are broken per target queue unless a death since then was a rejection; a message that failed and then expired while backing off keeps its last error", []string{
		"TestExpiryDeadLetterCycleIsBroken", "TestTwoQueueExpiryCycleDropsOnlyTheCyclingCopy",
		"TestCycleThroughARejectionIsNotBroken", "TestExpiredWhileBackingOffKeepsItsLastError",
	}},
	{"Ordering: with concurrency 1, a queue delivers in publish order; a retried message goes to the back when its backoff ends; a delayed message joins when its delay ends", []string{
		"TestConcurrencyOneDeliversInPublishOrder", "TestDelayedDelivery", "TestRetryDoesNotHoldTheWorker",
		"TestOneWorkerKeepsPublishOrderAcrossInboxAndBuffer",
	}},
	{"With concurrency above 1 the workers run side by side", []string{
		"TestExactlyConcurrencyWorkers", "TestConcurrencyNRunsNConsumersSideBySide",
	}},
	{"Publishing never waits for a consumer, and one slow queue never delays another, unless WithMaxLen(n, Block); a drained queue gives its memory back", []string{
		"TestPublishNeverBlocksOnASlowQueue", "TestMaxLenBlockWaitsForRoomUntilTheContextEnds",
		"TestQueueGivesMemoryBackAfterDraining", "TestFIFOGivesMemoryBackWhenDrained",
	}},
	{"User code cannot crash or freeze the MQ: a panic in a consumer is recovered for that message alone, logged with exchange, queue, message ID, attempt and stack, counted, and retried like an error", []string{
		"TestPanicAndErrorAreRecoveredPerMessageAndLogged", "TestPanicErrorInAnErrorChainIsLoggedWithItsStack",
		"TestPanicErrorUnwrapsAnErrorValue",
	}},
	{"A typed nil error fails with ErrTypedNil; runtime.Goexit fails with ErrGoexit and a new goroutine takes the worker's place", []string{
		"TestHandlerGoexitKeepsTheWorkerSlot", "TestEdgeErrorsAndPanicsSettleOnce", "TestReentrancy",
	}},
	{"The consumer's error (or panic value) is read once while the worker is guarded; an error or panic value whose methods panic or Goexit is contained, as are a logger and a codec that panic", []string{
		"TestConsumerErrorIsReadOnce", "TestPanicValueWithHostileMethodsIsContained", "TestHostilePanicValueKeepsItsMeaning",
		"TestPanicValueWhoseStringCallsShutdownIsContained", "TestHostileCodec", "TestReentrancy",
	}},
	{"From a consumer, filter or logger you may call anything; Stop or Shutdown called there begin the stop and return at once (Shutdown returns ErrCalledFromConsumer)", []string{
		"TestReentrancy", "TestStopAndShutdownFromATypedConsumerReturnAtOnce",
		"TestCodecPublishingDuringAnIDReservationDoesNotFreeze", "TestConcurrentRegistrationPublishingAndStats",
	}},
	{"A logger that blocks holds the goroutine that logs, never Shutdown's return: past its deadline Shutdown returns an error wrapping ctx.Err() that counts the MQ's goroutines still in a logger, filter or codec", []string{
		"TestReentrancy", "TestShutdownKeepsItsDeadlineWhileTheLoggerBlocksOnAFailedLog",
		"TestShutdownBeforeStartKeepsItsDeadlineWhileTheLoggerBlocks",
	}},
	{"Inputs that could never work are refused at the call that made them, with a sentinel error; durations past the year 2262 saturate", []string{
		"TestBadInputNeverPanics", "TestBadInputGetsSentinelErrors", "TestDeliveryOptionValidation",
		"TestHeadersBoundedInExpandedSize", "TestHugeDurationsSaturate", "TestFailedRegistrationChangesNothing",
	}},
	{"Stop and Shutdown stop accepting at once (ErrStopped; blocked publishers are released), deliver everything already accepted, including delayed and retrying messages and dead letters, and wait for every worker", []string{
		"TestStopReleasesBlockedPublishers", "TestStopIsIdempotentAndConcurrent", "TestShutdownReturnsNilWhenDrained",
		"TestTypedFormsRetriesWaitingAtStopOrShutdown", "TestHandlerStopAndShutdown",
		"TestStopWaitsForDeadLettersOnTheirWay", "TestStopWaitsForADeadLetterOnItsWayIntoAQueueWithNoConsumer",
		"TestStopEndsWhileMessagesCycleThroughAQueueThatNoConsumerTakes",
	}},
	{"Shutdown(ctx) when ctx ends first cancels the consumers' context, drops what no worker has begun, and returns an error wrapping ErrUndelivered and ctx.Err()", []string{
		"TestShutdownDeadlineCancelsConsumersAndCountsUndelivered", "TestShutdownCountsScheduledMessagesAsUndelivered",
		"TestShutdownDeadlineClearsScheduledMessages", "TestShutdownOfAnIdleMQWithAnEndedContextIsClean",
		"TestShutdownDeadlineCountsAMessageBegunJustBeforeIt", "TestAbortCountsAMessageBegunButNotYetDeliveredAsInHand",
		"TestShutdownDeadlineThatStopsARetryNeverReturnsNil", "TestStopAfterAShutdownDeadlineWaitsForADeadLetterOnItsWay",
		"TestShutdownDeadlineCountsADeadLetterBeingLoggedOnce",
	}},
	{"Cancelling the context given to Start stops as Stop does; Stop before Start drops what was published and logs how much", []string{
		"TestCancellingStartContextStopsLikeStop", "TestStopBeforeStart", "TestPublishBeforeStartIsDeliveredAfterStart",
		"TestShutdownBeforeStartWithAnEndedContextSaysWhatItDropped",
	}},

	// Run-time topology (in memory)
	{"DeclareQueue declares a named queue with no consumer: its messages wait, under its TTL, length limit and head expiry, and Stop counts what still waits as undelivered", []string{
		"TestDeclaredQueueKeepsMessagesUnderItsLimits", "TestConsumeDeliversTheBacklogOfADeclaredQueue",
		"TestStopWaitsForADeadLetterOnItsWayIntoAQueueWithNoConsumer", "TestStopRacingPublishersIntoAQueueWithNoConsumerEnds",
		"TestStopEndsWhenTheLastMessageExpiresAtTheHead", "TestShutdownReportsWhatWaitsInAQueueThatNoConsumerTakes",
	}},
	{"DeclareQueue again with the same settings returns nil and adds the binding if it is new; with other settings it returns ErrDuplicateQueue and changes nothing; RegisterQueue is a declare and a consumer until Stop", []string{
		"TestDeclareQueueAgain",
	}},
	{"Consume attaches a subscription; several subscriptions compete for one queue's messages, each going to one of them; ConsumeHandler and ConsumeDeliveries are its typed forms", []string{
		"TestConsumeDeliversTheBacklogOfADeclaredQueue", "TestCompetingSubscriptionsTakeEachMessageOnce", "TestTypedConsumeForms",
		"TestConsumeWhileWorkersWakeLosesNoWakeup",
	}},
	{"Subscription.Cancel takes no new message, gives back what it had taken and not begun to the head of the queue in order, waits for the deliveries in flight until ctx ends (then returns ctx's error; they finish and are settled in the background), is idempotent, and returns at once from inside its own consumer", []string{
		"TestCancelGivesBackTakenMessagesInTheirOrder", "TestCancelWaitsForDeliveriesInFlightUntilItsContextEnds",
		"TestCancelIsIdempotentAndConcurrent", "TestCancelFromItsOwnConsumerReturnsAtOnce", "TestCancelBeforeStart",
		"TestCancelWaitsForADeliveryThatCallsGoexit", "TestCancellingTheLastSubscriptionDuringStopLetsStopEnd",
	}},
	{"DeleteQueue removes the queue, its bindings and its waiting messages and returns how many (IfUnused: ErrInUse while it has a consumer; IfEmpty: ErrNotEmpty while messages wait or are in flight); deliveries in flight finish, a failure is removed, not retried or dead-lettered", []string{
		"TestDeleteQueueRemovesItsMessagesAndCountsThem", "TestPurgeOrDeleteReleasesPublishersBlockedOnTheQueue",
		"TestDeletedQueueCountsWhatEndsAfterItsDelete", "TestShutdownDeadlineBoundsADeletedQueuesConsumer",
	}},
	{"PurgeQueue removes the waiting messages (ready, delayed, backing off), not those in a consumer, and returns how many", []string{
		"TestPurgeQueueRemovesWhatWaitsNotWhatIsInAConsumer", "TestPurgeOrDeleteReleasesPublishersBlockedOnTheQueue",
		"TestRetryPurgedBeforeItReachedTheSchedulerReleasesItsGroupAtOnce", "TestPurgeRacingRetriesAndDelaysLeavesNoneBehind",
	}},
	{"Unbind removes that binding, and a missing binding is not an error; DeleteExchange removes an exchange and its bindings, the queues stay (IfUnused: ErrInUse while it has bindings)", []string{
		"TestUnbindRemovesThatBindingOnly", "TestDeleteExchangeRemovesItAndItsBindings",
	}},
	{"WithQueueExpiry deletes a queue unused for its expiry (no consumer, no Consume, no declare again), its messages removed and counted, not dead-lettered; expiry rides the one scheduler, no goroutine per idle queue", []string{
		"TestQueueExpiryDeletesAnUnusedQueue",
	}},
	{"A paused queue accepts messages but hands none to its consumers; deliveries in flight finish; ResumeQueue delivers the rest in order; Stop leaves what waits in a paused queue undelivered", []string{
		"TestPauseQueueHoldsMessagesUntilResumed", "TestPauseOrResumeThatChangesNothingLeavesTheWorkersAwake",
		"TestStopLeavesAPausedQueuesMessagesUndelivered",
	}},
	{"Stats and Topology show each queue's consumers and whether it is paused, and what deletes and purges removed (Stats.Deleted, DeletedQueues, ExpiredQueues, Removed, Purged)", []string{
		"TestStatsAndTopologyShowConsumersPausesAndDeletes", "TestDeletedQueueCountsWhatEndsAfterItsDelete",
	}},
	{"QueueStats.OldestAge is how long the oldest ready message waited (in a batch, a group's backlog, after a retry backoff, across a restart), at most a clock tick more, never less", []string{
		"TestOldestAgeIsHowLongTheOldestReadyMessageWaited", "TestOldestAgeCountsFromTheEndOfARetryBackoff",
		"TestOldestAgeSeesGroupBacklogs", "TestOldestAgeOfARestoredMessageCountsFromBeforeTheRestart",
		"TestOldestAgeBatchRemainderIsNotOlderThanItIs", "TestOldestAgeGroupNextBehindNewerHead",
		"TestOldestAgeRestoredDelayedHeadHidesOlderReady", "TestOldestAgeRealTimeNeverLessThanTruth",
		"TestOldestAgeIsAtMostATickOverWhenTheClockIsReadBetweenTicks", "TestOldestAgeCountsAnOlderMessageBehindOneAReplayPutBack",
		"TestFifoKeepsEachEntrysStamp",
	}},
	{"An Engine serves one MQ: a second MQ given it while the first has not shut down fails every call with ErrInvalidOption, the first unaffected; a stopped MQ never calls the engine again", []string{
		"TestEngineServingAnotherMQIsRefused", "TestAStoppedMQNeverReachesTheEngineOfTheNextMQ", "TestDistinctZeroSizeEnginesAreNotRefused",
		"TestEngineConcurrentMQsOneWins", "TestAnMQDroppedWithoutShutdownIsCollectedAndFreesItsEngine", "TestShutdownSurvivesAnEngineWhoseStatsPanic",
	}},
	{"A publish racing a delete or an unbind is all or nothing: it reaches the queue before the change (and is counted in what a delete removed) or not at all", []string{
		"TestPublishRacingDeleteOrUnbindIsAllOrNothing",
	}},
	{"Under a changing topology every accepted message ends once: succeeded, dead-lettered, dropped, purged, removed or undelivered", []string{
		"TestTopologyTortureKeepsTheLedger", "TestDeletedQueueCountsWhatEndsAfterItsDelete",
	}},
	{"10,000 queues declared and deleted in a loop return memory and goroutines to the baseline", []string{
		"TestDeclareDeleteLoopReturnsMemoryAndGoroutines",
	}},
	{"Topology calls refuse unknown names (ErrUnknownQueue, ErrUnknownExchange) and bad input with sentinel errors, and return ErrStopped after Stop", []string{
		"TestTopologyCallsRefuseBadInput", "TestConsumeAndCancelRefuseBadInput",
		"TestTopologyCallsAfterStopReturnErrStopped", "TestConsumeAfterStopAndCancelAfterStop",
	}},
	{"Topology calls from inside a consumer, filter or logger never deadlock, on the caller's own queue and subscription too", []string{
		"TestTopologyCallsFromUserCodeNeverDeadlock", "TestCancelFromItsOwnConsumerReturnsAtOnce",
	}},

	// Topology at run time, durable
	{"For a durable queue a delete, a purge and an expiry are each one synced record: after kill -9 or a power loss a deleted or expired queue stays deleted, declared again it starts empty, and a purged message never comes back; a declared queue keeps its backlog with no consumer", []string{
		"TestDeletedDurableQueueStaysDeleted", "TestDurableQueueDeclaredAgainAfterItsDeleteGetsOnlyItsOwnMessages",
		"TestMessageOfTwoDurableQueuesComesBackOnlyInTheOneNotDeleted", "TestPurgedDurableMessagesNeverComeBack",
		"TestDurableQueueDeclaredWithoutAConsumerKeepsItsBacklogAcrossRestarts", "TestExpiredDurableQueueStaysDeleted",
		"TestDeclaredDurableQueueIsListedAfterARestart", "TestDurableTopologySurvivesPowerLoss",
		"TestDeleteAndPurgeOnAFailedLogReturnErrLog", "TestRecoveryCollectsWhatDeletedQueuesLeft",
	}},

	// Operating TinyMQ
	{"Peek returns copies of the messages at the head of a queue, in order (those taken in a batch included, durable ones read from the log), and changes nothing", []string{
		"TestPeekShowsTheHeadInOrderAndChangesNothing", "TestPeekSeesMessagesTakenInABatch",
		"TestPeekReadsADurableQueueFromTheLog", "TestPeekRefusesBadInput",
	}},
	{"ReplayDeadLetters moves dead letters back to the exchange and key of their newest death, all or nothing each, one record per durable move (in exactly one of the two queues after a power loss); a message with no death record stays and is reported", []string{
		"TestReplayMovesDeadLettersBackToWhereTheyDied", "TestReplayLeavesWhatCannotMove", "TestReplayRefusesBadInput",
		"TestReplayOfADurableDeadLetterIsOneMove", "TestDurableTopologySurvivesPowerLoss",
	}},
	{"Health says whether the MQ is ready: started, not stopping, its log healthy", []string{
		"TestHealthSaysWhetherTheMQIsReady",
	}},

	// Job queue features
	{"WithDeliveryTimeout: a consumer that has not returned d after it began has failed with ErrDeliveryTimeout (a late nil too); a fresh worker takes its slot, so the pool keeps its size; abandoned calls are bounded, in Stats, and waited for by Stop within Shutdown's deadline", []string{
		"TestDeliveryTimeoutFailsTheCallAtItsDeadlineAndKeepsThePoolsSize", "TestDeliveryTimeoutLateNilIsNoSuccess",
		"TestDeliveryTimeoutAbandonedCallOwnsItsMsg", "TestStopWaitsForAbandonedCalls", "TestShutdownDeadlineHoldsWithAbandonedCalls",
	}},
	{"WithMessageGroup + WithGroupOrdering: one message of a group at a time, in publish order, retries included; other groups run in parallel; order survives a restart", []string{
		"TestGroupOrderingThousandGroupsKeepTheirPaceAndOrderWhileOneIsHeld", "TestGroupOrderingThousandGroupsKeepTheirOrderAcrossARestart",
		"TestGroupOrderingRetryHoldsBackOnlyItsGroup",
	}},
	{"WithDeduplicationID + WithDeduplication: a publish whose ID the exchange accepted within the window returns nil and routes nothing; bounded; durable across kill -9", []string{
		"TestDeduplicationRoutesAnIDOnceWithinTheWindow", "TestDeduplicationSurvivesAKill", "TestDeduplicationMemoryIsBounded",
		"TestDeduplicationForgetsTheIDOfEveryFailedPublish",
	}},
	{"WithRateLimit: deliveries begin at most at that rate; TTLs go on while messages wait for a token", []string{
		"TestRateLimitHoldsItsRateWithin5PercentOver10Seconds", "TestRateLimitLetsTTLsExpireWhileMessagesWaitForAToken",
	}},
	{"Typed publish: a queue of a typed consumer takes only T, other data refused at Publish with ErrPayloadType, all or nothing, the same in memory and durable", []string{
		"TestTypedPublishRefusesDataOfAnotherType", "TestTypedPublishIsAllOrNothing", "TestTypedPublishInMemoryAndDurableQueuesAgree",
		"TestARepeatedPublishFailsAsAFirstOneWould",
	}},
	{"The job features together keep the ledger", []string{"TestTimeoutRateLimitAndDedupTortureKeepsTheLedger"}},
	// Middleware, defaults
	{"WithMiddleware wraps every consumer of every form, WithPublishMiddleware every publish; first outermost; guarded as user code", []string{
		"TestMiddlewareWrapsEveryConsumerForm", "TestPublishMiddlewareAddsHeadersAndSeesTheOutcome",
		"TestMiddlewarePanicFailsOneDelivery", "TestPublishMiddlewareIsCheckedAndGuarded",
	}},
	{"Without WithLogger, a drop, a dead letter and an undelivered message go to slog.Default as warnings or errors", []string{
		"TestDefaultLoggerShowsLossesOnSlogDefault",
	}},
	{"The quick start compiles and runs as written", []string{"TestReadmeQuickStartIsTheProgramCIRuns"}},
	// Durability
	{"A Publish that reached a durable queue returned nil only once the message was on disk", []string{
		"TestDurableMessagesSurviveARestart", "TestDurablePublishHoldsNoLockAcrossItsSync", "TestCrash",
		"TestConcurrentDurablePublishesKeepEveryByte",
	}},
	{"On the next Start every message its consumer had not acknowledged is delivered again, with Msg.Redelivered set, including those a Shutdown deadline left", []string{
		"TestDurableMessagesSurviveARestart", "TestOnlyUnacknowledgedMessagesComeBack",
		"TestOnlyUnacknowledgedMessagesComeBack",
		"TestDurableQueueOnTwoExchangesAcknowledgesEachApart", "TestDurableMessageRetriedThenSucceededIsNotRedelivered",
		"TestDurableFailureWithoutRetryIsAcknowledged", "TestDurableShutdownDeadlineLosesNothingAcrossARestart",
		"TestDurableMessageFailingAfterTheDeadlineStaysInTheLog", "TestShutdownDeadlineReleasesTheDataDir",
		"TestAcksOfAnIdleMQAreWrittenWithoutAnotherPublish",
	}},
	{"Retry attempts and backoffs, delays, TTL deadlines and death records survive with it", []string{
		"TestRetryAttemptsSurviveRestarts",
		"TestDurableRetriesStayIsolatedPerQueueAcrossARestart", "TestDelaysAndDeadlinesSurviveARestart",
	}},
	{"A length limit applies to what a durable queue restores", []string{
		"TestLengthLimitAppliesToRestoredMessages", "TestDurableLengthLimitsKeepTheLogInStep",
	}},
	{"Moving a message to a durable dead-letter queue is one log record: after a crash it is in exactly one of the two", []string{
		"TestDeadLetterMoveIsAtomic", "TestDeadLetterOfADurableQueueKeepsItsType",
	}},
	{"Message IDs stay unique across restarts", []string{
		"TestIDsStayUniqueAcrossRestarts",
	}},
	{"Messages of a durable queue that is not registered again stay on disk, are logged at Start and shown in Stats() (Unregistered), and are never deleted unasked", []string{
		"TestUnregisteredDurableQueueIsShownNotDeleted", "TestDurableBacklogUnderAnInMemoryQueueStaysVisible",
	}},
	{"After a process crash nothing confirmed is lost, under either sync policy; after a power loss nothing confirmed is lost with the default policy", []string{
		"TestCrash", "wal.TestUnsyncedWriteHole", "wal.TestSyncInterval", "wal.TestCommitAsyncOrderAndDurability",
	}},
	{"Data: a durable message is encoded once per publish, before any lock; its consumer receives Data as a tinymq.Encoded every time, and a Handler[T] consumer its T", []string{
		"TestDurableDataIsEncodedEveryTime", "TestHostileCodec", "TestTypedFormsOnADurableQueueGetEncodedData",
		"TestDeliveryHandlerOnADurableQueue", "TestJSONCodecBytesAsEncodingJSON",
	}},
	{"A message is at most WithMaxMessageSize(n) bytes: over it, it is refused with ErrTooLarge before anything is copied or encoded, on every queue", []string{
		"TestMaxMessageSize", "TestDurableMaxMessageSize", "TestMaxMessageSizeOfZeroOrLessIsTheDefault",
		"TestTooLargeIsRefusedBeforeWaitingForRoom",
	}},
	{"Disk errors: a full disk or a failed write or fsync makes Publish return an error wrapping ErrLog and no queue takes the message; after a failed fsync every durable publish fails until a restart", []string{
		"TestDiskFaults", "TestReentrancy", "wal.TestFailedSync", "wal.TestFailedWrite", "wal.TestFailedRoll", "wal.TestNoCallHangsAfterAFailure",
	}},
	{"A second MQ opening the same directory gets ErrLocked; a refused open keeps nothing", []string{
		"TestDataDirIsLocked", "TestRefusedOpenKeepsNothingAndARetrySucceeds",
		"TestDataDirThatCannotBeOpenedIsRetriedOnceFixed", "TestRacingOpenersOneWinsTheOthersRetry",
		"wal.TestLockSameProcess", "wal.TestLockOtherProcess", "wal.TestRefusedOpenKeepsNothing",
	}},
	{"The log's files are created private (0600, the directory 0700) and opened without following symbolic links: a planted LOCK or segment symlink is refused, and its target never touched", []string{
		"TestPlantedLockSymlinkIsNeverFollowed", "TestReentrancy", "wal.TestFilesArePrivate",
		"wal.TestLockDoesNotFollowSymlink", "wal.TestSymlinkedSegmentRefused", "wal.TestPlantedNextSegmentSymlinkIsNeverFollowed",
	}},
	{"The log: segment files with a versioned header, length-prefixed records with CRC-32C", []string{
		"wal.TestRecordCRCMatchesSpec", "wal.FuzzDecodeRecord", "wal.TestSegmentNames", "wal.TestVersion1LogWithoutTrimRecordsOpens",
	}},
	{"Segments whose messages are all acknowledged are deleted, and one held by a few long-lived messages is compacted, so a steady load does not grow the directory", []string{
		"wal.TestBoundedDisk", "wal.TestCompaction", "wal.TestBoundedDiskBehindAMostlyLiveOldestSegment",
		"wal.TestBoundedDiskWithValuesLargerThanASegment", "wal.TestCompactionChunkBoundaries",
	}},
	{"A torn tail left by a crash is cut on open; corruption before the tail is refused with an error naming the file and offset (the log package can repair it)", []string{
		"wal.TestTruncateEveryOffset", "wal.TestFlipEveryByte", "wal.TestRepair", "wal.TestMissingOldestSegment",
		"wal.TestMergedAsyncBatchesStayAtomicUnderATornTail", "TestCorruptLogIsRefusedUnlessRepaired",
		"TestTornTailIsCutWithoutAsking",
	}},
}

// TestEveryPromiseHasATest fails if a test named in promises does not exist,
// so that the index cannot rot.
func TestEveryPromiseHasATest(t *testing.T) {
	have := map[string]bool{}
	for prefix, dir := range map[string]string{"": ".", "wal.": filepath.Join("internal", "wal")} {
		files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no test files in %s (%v)", dir, err)
		}
		fset := token.NewFileSet()
		for _, f := range files {
			af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range af.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil {
					have[prefix+fd.Name.Name] = true
				}
			}
		}
	}
	seen := map[string]bool{}
	for _, p := range promises {
		if len(p.tests) == 0 {
			t.Errorf("promise %q: no test", p.promise)
		}
		if seen[p.promise] {
			t.Errorf("promise %q listed twice", p.promise)
		}
		seen[p.promise] = true
		for _, name := range p.tests {
			short := strings.TrimPrefix(name, "wal.")
			if !strings.HasPrefix(short, "Test") && !strings.HasPrefix(short, "Fuzz") {
				t.Errorf("promise %q: %s is not a test name", p.promise, name)
			}
			if !have[name] {
				t.Errorf("promise %q: test %s does not exist", p.promise, name)
			}
		}
	}
}
